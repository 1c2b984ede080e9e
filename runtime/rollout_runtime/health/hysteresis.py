"""Shard health as a hysteresis state machine: probe results in, phase transitions out.

Pure and synchronous (no clock, no I/O), so the runtime's local probing and the Kubernetes operator share one
implementation and tests can drive it result by result.

Phases::

    Pending --success x S--> Healthy --failure--> Suspect --failure x F (in a row)--> Unhealthy
       |                        ^                    |                                   |
       +--failure x F--> Unhealthy                   +--success x S (in a row)--> Healthy |
                                ^------------------------------- success x S (in a row) -+
    any --set_draining(True)--> Draining --set_draining(False)--> the phase the probes say

(S = ``success_threshold``, F = ``failure_threshold``.) With F = 1 a failure goes straight from Healthy to
Unhealthy.

Weights (Stale, Refitting)::

    refit recorded (version v) --instance identity changes--> Stale --begin_refit--> Refitting
    Refitting --refit_succeeded(v')--> the phase the probes say      Refitting --refit_failed--> Stale

A shard the trainer refit holds that policy's weights only while it is the same process: a restart loads the base
checkpoint. :meth:`HealthState.observe_instance` is the one entry point for restart evidence, whatever its source
(an SGLang or vLLM weight version, the process start time in ``/metrics``, a pod's ``<uid>:<restartCount>``, a
probe outage long enough to mean dead; see :mod:`rollout_runtime.weights`): an identity is an opaque string, the
first sighting is recorded, and a change makes a refit shard Stale. Stale and Refitting never serve, and only
:meth:`HealthState.refit_succeeded` leaves them (NeMo-RL's fleet health has the same rule: no DEAD->HEALTHY path,
only ``report_refit``). A refit that fails leaves the shard Stale: it may hold half-updated weights. A shard no
refit was ever recorded for has no version to lose, so an identity change there is only recorded (a fleet that
never refits behaves as before). Probes still run underneath Stale and Refitting, as under Draining.

Why Suspect serves: one failed probe is a blip as often as an outage. A Suspect shard stays eligible for traffic;
only F consecutive failures take it out, and only S consecutive successes bring it back. The runtime's passive
ejection reacts to real request failures faster than any probe, so serving through Suspect costs little.
Pending does not serve: a shard is never trusted before it has answered S probes.

Draining overrides health: a draining shard takes no new traffic whatever its probes say. Probes still run and
are still recorded underneath, so un-draining lands on the phase the probes support without waiting.

Passive liveness: a shard that is completing real requests is alive. A busy single-threaded server (llama.cpp's
``/v1/models`` waits on the model lock) times its probes out while it serves, so a request that completed within
the *liveness window* (``(failure_threshold - 1) x period_seconds``) before a probe timeout excuses that timeout:
it still counts as a failed probe (Healthy -> Suspect, which serves), but the failure streak stops one short of
``failure_threshold``, so timeouts alone never make a serving shard Unhealthy. Only a timeout is excused: a
definite failure (connection refused, a 5xx, the wrong model ...) means what it always means, and completes the
streak. Probe successes are never request evidence, and request successes never raise a phase (only probes bring
a shard back): the mirror of NeMo-RL's separate streaks, where a wedged engine still answers its liveness probe
and only a successful generation clears the request streak. With the window above, a shard leaves within
``failure_threshold x period_seconds + timeout_seconds`` of the later of its death and its last completed request;
with ``failure_threshold`` 1 there is no window (one failed probe, a timeout included, is decisive).
"""

from __future__ import annotations

import contextlib
import enum
import re
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from rollout_runtime.schema import ClusterView, Comparison, rules_validator

__all__ = [
    "MAX_PROBE_MESSAGE_CHARS",
    "PROBE_IN_CLUSTER",
    "PROBE_RULES",
    "WEIGHTS_REASONS",
    "HealthPhase",
    "HealthState",
    "ProbeReason",
    "ProbeResult",
    "ProbeSettings",
    "Transition",
    "derived_timeout_seconds",
]

DEFAULT_PROBE_TIMEOUT_SECONDS: Final[float] = 2.0


def derived_timeout_seconds(period_seconds: float) -> float:
    """The probe timeout when only the period is given: the smaller of 2 s and half the period, so a short period
    alone is valid (the timeout stays below it) and the default period keeps the 2 s default.

    The one statement of the rule: ProbeSettings applies it, and a cluster object leaves ``timeoutSeconds`` unset
    (no CRD default) so the operator applies it too when it reads the object.
    """
    return min(DEFAULT_PROBE_TIMEOUT_SECONDS, period_seconds / 2)


MAX_PROBE_MESSAGE_CHARS: Final[int] = 512
"""Bound on a probe message: it lands in a CR status and in logs, never in a metric label."""


class HealthPhase(str, enum.Enum):
    """Where a shard stands; the values are the phases a GenerationShard's status shows."""

    PENDING = "Pending"
    HEALTHY = "Healthy"
    SUSPECT = "Suspect"
    UNHEALTHY = "Unhealthy"
    DRAINING = "Draining"
    STALE = "Stale"
    """Restarted since its last refit: it holds base weights, not the trainer's policy; no traffic until refit."""
    REFITTING = "Refitting"
    """The trainer is updating its weights: no traffic (it never serves half-updated)."""

    @property
    def serving(self) -> bool:
        """Whether a shard in this phase is eligible for traffic (Healthy, or Suspect: see the module docstring)."""
        return self in (HealthPhase.HEALTHY, HealthPhase.SUSPECT)


class ProbeReason(str, enum.Enum):
    """Why a probe failed: a short, bounded label, safe as a metric label value."""

    OK = "ok"
    CONNECT = "connect"
    """Connection refused, reset, or dropped; DNS failure."""
    TIMEOUT = "timeout"
    """No complete answer within ``timeout_seconds``."""
    STATUS = "status"
    """The health or models endpoint answered with a non-2xx, non-3xx status."""
    REDIRECT = "redirect"
    """A 3xx: probes never follow redirects (a redirect could point anywhere)."""
    WRONG_MODEL = "wrong_model"
    """``/v1/models`` does not list the model the shard must serve."""
    MALFORMED = "malformed"
    """``/v1/models`` answered 200 with a body that is not the OpenAI model list."""
    TOO_LARGE = "too_large"
    """A response body exceeded the prober's read bound."""
    FORBIDDEN_TARGET = "forbidden_target"
    """The target URL is refused by the probe target policy; nothing was sent."""
    ERROR = "error"
    """Anything else (a bug or an unexpected client error); the message says what."""


PROBE_RULES: Final[tuple[Comparison, ...]] = (
    Comparison("timeout_seconds", "<", "period_seconds", "or probes of one target overlap"),
)
"""The probe's cross-field rule: checked here and, as CEL, by the API server on a shard's ``spec.probe``."""

WEIGHTS_REASONS: Final[frozenset[str]] = frozenset({"restart", "stale", "refit_started", "refit", "refit_failed"})
"""Transition reasons of the weights path: an identity change, an explicit mark, and the three refit steps."""

_PROBE_PATH: Final[re.Pattern[str]] = re.compile(r"^/[^?#\\\s]*$")


class ProbeSettings(BaseModel):
    """How a shard is probed. Defaults follow the CRD: period 5 s, timeout 2 s (given only a period, the smaller of
    2 s and half the period), failure 3, success 2.

    Field names are snake_case in Python and camelCase (``periodSeconds``) in Kubernetes; both validate.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True, use_attribute_docstrings=True
    )

    path: Annotated[str, Field(min_length=1, max_length=1024)] = "/health"
    """Health endpoint path relative to the target's base URL (no query, no fragment)."""
    period_seconds: Annotated[float, Field(gt=0, le=3600)] = 5.0
    """Seconds between probe starts."""
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = DEFAULT_PROBE_TIMEOUT_SECONDS
    """Deadline for one whole probe (health plus model check); must be less than the period. Unset, it follows the
    period: the smaller of 2 s and half the period (2 s at the default period)."""
    failure_threshold: Annotated[int, Field(ge=1, le=1000)] = 3
    """Consecutive failed probes that make a target Unhealthy (out of the healthy set)."""
    success_threshold: Annotated[int, Field(ge=1, le=1000)] = 2
    """Consecutive successful probes that make a Pending, Suspect or Unhealthy target Healthy."""
    check_model: bool = False
    """Also GET ``/v1/models`` and require the shard's model in it. Off by default for a runtime-probed shard (a
    server may not serve that path, or only when idle); a GenerationShard in a cluster defaults it on."""
    generate: bool = False
    """Also prove the engine generates: POST a 1-token completion (``/v1/completions``, within the same deadline).
    vLLM's ``/health`` answers 200 while its engine is frozen, so only a generation tells (as SGLang's
    ``/health_generate``). Skipped while real requests complete (passive evidence is preferred: no extra load)."""

    @model_validator(mode="before")
    @classmethod
    def _timeout_follows_period(cls, data: Any) -> Any:
        if isinstance(data, dict):
            period = data.get("period_seconds", data.get("periodSeconds"))
            if period is not None and "timeout_seconds" not in data and "timeoutSeconds" not in data:
                with contextlib.suppress(TypeError, ValueError):
                    data = {**data, "timeout_seconds": derived_timeout_seconds(float(period))}
        return data

    @field_validator("path")
    @classmethod
    def _absolute_path(cls, value: str) -> str:
        if not _PROBE_PATH.fullmatch(value) or value.startswith("//"):
            raise ValueError(f"path must be an absolute URL path like '/health' (no query, no host), got {value!r}")
        return value

    _rules = rules_validator(PROBE_RULES)


PROBE_IN_CLUSTER: Final[ClusterView] = ClusterView(
    scope="probe",
    rules=PROBE_RULES,
    defaults={"check_model": True},
    minimum={"period_seconds": 0.05, "timeout_seconds": 0.01},
    derived=frozenset({"timeout_seconds"}),
    schema={
        "path": {
            "pattern": _PROBE_PATH.pattern,
            "x-kubernetes-validations": [
                {
                    "rule": "!self.startsWith('//')",
                    "message": "probe.path must be a path on the target like /health, not a host (it starts with //)",
                }
            ],
        }
    },
)
"""A shard's ``spec.probe`` against this model: the operator probes every target of every namespace, so a
cluster object may not ask for probes faster than every 50 ms; the path check is spelled as a pattern and CEL; the
CRD does not default ``timeoutSeconds`` (the API server would fill in 2 s and then reject ``periodSeconds: 1``), so
it follows the period as it does here (:func:`derived_timeout_seconds`)."""


def _bounded(text: str, limit: int = MAX_PROBE_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ProbeResult(BaseModel):
    """The outcome of one probe. ``ok`` is true exactly when ``reason`` is ``ProbeReason.OK``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    reason: ProbeReason = ProbeReason.OK
    message: str = ""
    """Human-readable detail, bounded to MAX_PROBE_MESSAGE_CHARS."""
    latency_seconds: Annotated[float, Field(ge=0)] = 0.0
    status: int | None = None
    """The HTTP status of the last response seen, if any."""
    at: float = 0.0
    """Wall-clock time (unix seconds) the probe finished; 0 when unknown."""

    @field_validator("message")
    @classmethod
    def _bound_message(cls, value: str) -> str:
        return _bounded(value)

    @model_validator(mode="after")
    def _ok_matches_reason(self) -> ProbeResult:
        if self.ok != (self.reason is ProbeReason.OK):
            raise ValueError(f"ok={self.ok} contradicts reason={self.reason.value!r}")
        return self

    @classmethod
    def success(cls, *, latency_seconds: float = 0.0, status: int | None = 200, at: float = 0.0) -> ProbeResult:
        return cls(ok=True, latency_seconds=latency_seconds, status=status, at=at)

    @classmethod
    def failure(
        cls,
        reason: ProbeReason,
        message: str,
        *,
        latency_seconds: float = 0.0,
        status: int | None = None,
        at: float = 0.0,
    ) -> ProbeResult:
        if reason is ProbeReason.OK:
            raise ValueError("a failed probe needs a failure reason, not 'ok'")
        return cls(ok=False, reason=reason, message=message, latency_seconds=latency_seconds, status=status, at=at)


class Transition(BaseModel):
    """A phase change, with the label and message of what caused it (for events, conditions, metrics)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    from_phase: HealthPhase
    to_phase: HealthPhase
    reason: str
    """A bounded label: a ProbeReason value, "drain" / "undrain", or a weights reason (``WEIGHTS_REASONS``)."""
    message: str = ""

    @property
    def serving_changed(self) -> bool:
        return self.from_phase.serving != self.to_phase.serving


class HealthState:
    """One shard's health: feed it probe results with :meth:`observe`, read :attr:`phase` and :attr:`serving`."""

    __slots__ = (
        "_draining",
        "_failures",
        "_health",
        "_instance",
        "_refitting",
        "_request_ok_at",
        "_settings",
        "_stale",
        "_successes",
        "_weights_version",
        "last_error",
        "last_reason",
        "last_result",
    )

    def __init__(self, settings: ProbeSettings | None = None) -> None:
        self._settings = settings or ProbeSettings()
        self._health = HealthPhase.PENDING
        """The phase the probes support; ``phase`` reports Draining over it while draining."""
        self._draining = False
        self._successes = 0
        self._failures = 0
        self._request_ok_at: float | None = None
        self._stale = False
        self._refitting = False
        self._instance: str | None = None
        self._weights_version: int | None = None
        self.last_result: ProbeResult | None = None
        self.last_reason: ProbeReason | None = None
        """Reason of the latest failed probe (kept after recovery, like last_error)."""
        self.last_error: str | None = None
        """Message of the latest failed probe (kept after recovery: it says what happened last time)."""

    @classmethod
    def restore(
        cls,
        settings: ProbeSettings,
        phase: HealthPhase,
        *,
        consecutive_successes: int = 0,
        consecutive_failures: int = 0,
        draining: bool = False,
        last_error: str | None = None,
        instance: str | None = None,
        weights_version: int | None = None,
    ) -> HealthState:
        """Rebuild a state from a persisted status (the operator after a restart).

        A persisted Draining, Stale or Refitting phase without a known underlying phase resumes as Pending
        underneath. A persisted Refitting resumes as Stale: nobody finishes a refit the operator saw begin, so the
        shard must be refit again before it serves.
        """
        if consecutive_successes < 0 or consecutive_failures < 0:
            raise ValueError("consecutive counts must be >= 0")
        if consecutive_successes and consecutive_failures:
            raise ValueError("a state cannot have consecutive successes and failures at once")
        state = cls(settings)
        overlays = (HealthPhase.DRAINING, HealthPhase.STALE, HealthPhase.REFITTING)
        state._health = HealthPhase.PENDING if phase in overlays else phase
        state._draining = draining or phase is HealthPhase.DRAINING
        state._stale = phase in (HealthPhase.STALE, HealthPhase.REFITTING)
        state._instance = instance
        state._weights_version = None if state._stale else weights_version
        state._successes = consecutive_successes
        state._failures = consecutive_failures
        state.last_error = last_error
        return state

    @property
    def settings(self) -> ProbeSettings:
        return self._settings

    @settings.setter
    def settings(self, value: ProbeSettings) -> None:
        """New thresholds apply from the next observation; the current phase is kept."""
        self._settings = value

    @property
    def phase(self) -> HealthPhase:
        """Refitting over Stale over Draining over what the probes say (the most urgent reason for no traffic)."""
        if self._refitting:
            return HealthPhase.REFITTING
        if self._stale:
            return HealthPhase.STALE
        return HealthPhase.DRAINING if self._draining else self._health

    @property
    def health_phase(self) -> HealthPhase:
        """The phase the probes support, ignoring draining."""
        return self._health

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def serving(self) -> bool:
        """Eligible for traffic: Healthy or Suspect, and not draining."""
        return self.phase.serving

    @property
    def consecutive_successes(self) -> int:
        return self._successes

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def liveness_window_seconds(self) -> float:
        """How long a completed request excuses probe timeouts: ``(failure_threshold - 1) x period_seconds``."""
        return (self._settings.failure_threshold - 1) * self._settings.period_seconds

    @property
    def request_ok_at(self) -> float | None:
        """When (the caller's clock) a real request to the shard last completed, if one did."""
        return self._request_ok_at

    def request_succeeded(self, now: float) -> None:
        """A real request (not a probe) to the shard completed at ``now``: evidence of life for the liveness window.

        It never changes the phase by itself (see the module docstring).
        """
        if self._request_ok_at is None or now > self._request_ok_at:
            self._request_ok_at = now

    def alive_at(self, now: float) -> bool:
        """Whether a request completed within the liveness window before ``now``."""
        window = self.liveness_window_seconds
        return window > 0 and self._request_ok_at is not None and now - self._request_ok_at <= window

    def excuses(self, result: ProbeResult, now: float | None) -> bool:
        """Whether request evidence excuses this failed probe: a timeout while requests complete (never a definite
        failure). Without ``now`` there is no evidence to weigh."""
        return not result.ok and result.reason is ProbeReason.TIMEOUT and now is not None and self.alive_at(now)

    def observe(self, result: ProbeResult, *, now: float | None = None) -> Transition | None:
        """Record one probe result; return the visible phase change it caused, if any.

        ``now`` is the time on the clock :meth:`request_succeeded` is given; without it, request evidence is
        not consulted (a source that reports no requests has none anyway).
        """
        before = self.phase
        self.last_result = result
        excused = self.excuses(result, now)
        if excused:
            if self._failures < self._settings.failure_threshold - 1:  # never completes the streak, never lowers it
                self._failures += 1
            self._successes = 0
            self.last_reason = result.reason
            self.last_error = result.message or result.reason.value
            if self._health is HealthPhase.HEALTHY:
                self._health = HealthPhase.SUSPECT
        elif result.ok:
            self._successes += 1
            self._failures = 0
            if self._health is not HealthPhase.HEALTHY and self._successes >= self._settings.success_threshold:
                self._health = HealthPhase.HEALTHY
        else:
            self._failures += 1
            self._successes = 0
            self.last_reason = result.reason
            self.last_error = result.message or result.reason.value
            if self._failures >= self._settings.failure_threshold:
                self._health = HealthPhase.UNHEALTHY
            elif self._health is HealthPhase.HEALTHY:
                self._health = HealthPhase.SUSPECT
        after = self.phase
        if after is before:
            return None
        message = result.message
        if excused:
            message = f"{message}; requests are completing, so probe timeouts alone do not make it Unhealthy"
        return Transition(from_phase=before, to_phase=after, reason=result.reason.value, message=message)

    def set_draining(self, draining: bool) -> Transition | None:
        """Start or stop draining; return the visible phase change, if any."""
        before = self.phase
        self._draining = draining
        after = self.phase
        if after is before:
            return None
        return Transition(
            from_phase=before,
            to_phase=after,
            reason="drain" if draining else "undrain",
            message="draining: no new traffic" if draining else f"drain lifted; probes say {after.value}",
        )

    # -- weights: restart evidence and refits (see the module docstring) ------------------------------------

    @property
    def stale(self) -> bool:
        """Restarted (or a refit failed) since the last successful refit; also true while Refitting from Stale."""
        return self._stale

    @property
    def refitting(self) -> bool:
        return self._refitting

    @property
    def instance(self) -> str | None:
        """The latest instance identity seen (opaque; see :meth:`observe_instance`)."""
        return self._instance

    @property
    def weights_version(self) -> int | None:
        """The policy version of the last successful refit of this instance; None when unknown (never refit, a
        restart since, a refit that failed or is in progress)."""
        return None if self._stale or self._refitting else self._weights_version

    def observe_instance(self, identity: str | None, *, now: float | None = None) -> Transition | None:
        """Record the shard's instance identity; the single entry point for restart evidence from any source.

        ``identity`` is opaque (compared for equality only): a pod's ``"<uid>:<restartCount>"``, a process start
        time, an SGLang weight version, an outage epoch. None means "no evidence this time" and changes nothing.
        The first identity is recorded; a different one later means another process now answers: a shard that
        holds a refit version becomes Stale (the returned transition, reason ``restart``). ``now`` is accepted for
        callers on a clock and is not consulted: the decision needs no time.
        """
        del now
        if identity is None:
            return None
        previous, self._instance = self._instance, identity
        if previous is None or previous == identity:
            return None
        if self._weights_version is None and not self._stale and not self._refitting:
            return None  # never refit: it still holds what it always held
        return self._weights_change(
            stale=True,
            refitting=self._refitting,
            version=None,
            reason="restart",
            message=f"instance identity changed ({_bounded(previous, 80)} -> {_bounded(identity, 80)}):"
            " restarted with base weights, stale until refit",
        )

    def mark_stale(self, message: str = "") -> Transition | None:
        """Make the shard Stale whatever its version (restart evidence that carries no identity, an operator)."""
        return self._weights_change(
            stale=True, refitting=self._refitting, version=None, reason="stale", message=message or "marked stale"
        )

    def begin_refit(self) -> Transition | None:
        """The trainer starts updating the weights: no new traffic until :meth:`refit_succeeded` or
        :meth:`refit_failed`."""
        return self._weights_change(
            stale=self._stale,
            refitting=True,
            version=self._weights_version,
            reason="refit_started",
            message="refitting: no traffic until the weight update finishes",
        )

    def refit_succeeded(self, version: int, *, identity: str | None = None) -> Transition | None:
        """The weights of this instance are now policy ``version`` (the only way out of Stale and Refitting).

        ``identity``, when the caller read it after the update, is recorded as the instance the version belongs to
        (an SGLang shard's identity is its weight version, which the update itself changes).
        """
        if version < 0:
            raise ValueError(f"a weights version is a policy step >= 0, got {version}")
        if identity is not None:
            self._instance = identity
        return self._weights_change(
            stale=False, refitting=False, version=version, reason="refit", message=f"refit to weights version {version}"
        )

    def refit_failed(self, message: str = "") -> Transition | None:
        """The weight update failed: the shard may hold half-updated weights, so it stays Stale until a refit
        succeeds."""
        return self._weights_change(
            stale=True,
            refitting=False,
            version=None,
            reason="refit_failed",
            message=f"refit failed: {message}" if message else "refit failed",
        )

    def _weights_change(
        self, *, stale: bool, refitting: bool, version: int | None, reason: str, message: str
    ) -> Transition | None:
        before = self.phase
        self._stale, self._refitting, self._weights_version = stale, refitting, version
        after = self.phase
        if after is before:
            return None
        return Transition(from_phase=before, to_phase=after, reason=reason, message=_bounded(message))

    def __repr__(self) -> str:
        return (
            f"HealthState(phase={self.phase.value}, successes={self._successes}, failures={self._failures},"
            f" last_error={self.last_error!r}, weights_version={self.weights_version})"
        )
