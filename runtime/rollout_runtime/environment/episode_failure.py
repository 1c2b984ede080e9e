"""The environment's handled episode failure, and how the reply reports it.

A handled failure is one :class:`FailureEvent` (what happened, at which stage, why) with the local policy kept
apart: ``terminal`` (may another attempt succeed?) and ``evidence`` (partial results) are runtime outcome data for
the response adapter, never event fields. The adapter builds the protocol's :class:`EpisodeFailure` after cleanup,
and the :class:`FailureReport` goes in the reply's ``failure_report``, beside the failure.

Anything a protocol raises that is not a handled failure becomes a terminal one with a bounded message: the caller
sees the error's class and message, never a stack trace (that goes to the server's log).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError

from rollout_runtime.environment.failures import (
    MAX_FAILURE_REASON_CHARS,
    bound_reason,
    format_exception_with_response_body,
    is_retryable_dependency_error,
)

__all__ = [
    "EPISODE_FAILED",
    "EPISODE_TIMEOUT",
    "UNHANDLED_EXCEPTION",
    "EpisodeFailure",
    "FailureEvent",
    "FailureReport",
    "HandledEpisodeFailure",
    "dependency_episode_failure",
    "handled_episode_failure",
    "is_handled_episode_failure",
    "unhandled_episode_failure",
]

EPISODE_FAILED: Final[str] = "episode_failed"
"""The registered kind an event records when the failure names none."""
EPISODE_TIMEOUT: Final[str] = "episode_timeout"
ADMISSION_TIMEOUT: Final[str] = "admission_timeout"
ADMISSION_REJECTED: Final[str] = "admission_rejected"
UNHANDLED_EXCEPTION: Final[str] = "unhandled_exception"
EPISODE_IN_PROGRESS: Final[str] = "episode_in_progress"
"""Another attempt of the same episode_id is still live on the server: a non-terminal refusal (409)."""
DEPENDENCY_FAILED: Final[str] = "dependency_failed"

Reason = Annotated[str, Field(max_length=MAX_FAILURE_REASON_CHARS)]
Name = Annotated[str, Field(min_length=1, max_length=128)]

_EVIDENCE: Final[TypeAdapter[dict[str, JsonValue]]] = TypeAdapter(dict[str, JsonValue])


class FailureEvent(BaseModel):
    """What happened: the one event a handled failure records."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Name = EPISODE_FAILED
    stage: Name
    reason: Reason
    error_type: Name | None = None


class EpisodeFailure(BaseModel):
    """The wire failure of the default episode protocol: what a client needs to decide on a retry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Name
    stage: Name
    reason: Reason
    terminal: bool
    """True: another attempt would fail the same way (the runtime reports it as data); False: retry elsewhere."""


class FailureReport(BaseModel):
    """Beside the failure in the reply: the event, the local policy, and any partial evidence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: FailureEvent
    terminal: bool
    dependency: bool = False
    """The failure came from a call to another server."""
    evidence: dict[str, JsonValue] = Field(default_factory=dict)


class HandledEpisodeFailure(Exception):
    """An environment failure built by :func:`handled_episode_failure`: raise it to end the episode."""

    def __init__(
        self,
        event: FailureEvent,
        *,
        terminal: bool,
        evidence: Mapping[str, Any] | None = None,
        dependency: bool = False,
    ) -> None:
        super().__init__(f"{event.stage}: {event.reason}")
        self.event = event
        self.terminal = terminal
        self.evidence = _json_evidence(evidence or {})
        self.dependency = dependency

    def report(self) -> FailureReport:
        return FailureReport(
            event=self.event, terminal=self.terminal, dependency=self.dependency, evidence=self.evidence
        )

    def wire_failure(self) -> EpisodeFailure:
        return EpisodeFailure(
            kind=self.event.kind, stage=self.event.stage, reason=self.event.reason, terminal=self.terminal
        )


def handled_episode_failure(
    stage: str,
    reason: str,
    *,
    terminal: bool,
    failure_kind: str | None = None,
    error_type: str | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> HandledEpisodeFailure:
    """The environment's handled episode failure (raise it). ``failure_kind`` unset records ``episode_failed``."""
    event = FailureEvent(
        kind=failure_kind or EPISODE_FAILED, stage=stage, reason=bound_reason(reason), error_type=error_type
    )
    return HandledEpisodeFailure(event, terminal=terminal, evidence=evidence)


def is_handled_episode_failure(error: BaseException) -> bool:
    """Whether ``error`` is an environment failure built by :func:`handled_episode_failure`."""
    return isinstance(error, HandledEpisodeFailure)


def dependency_episode_failure(
    error: BaseException,
    *,
    stage: str,
    response_body: str | None = None,
    name_error_type: bool = False,
    terminal: bool | None = None,
    failure_kind: str | None = None,
    **fields: Any,
) -> HandledEpisodeFailure:
    """Turn a failed call to another server into the episode's failure.

    The reason keeps the dependency's own explanation from its response body (see
    :func:`~rollout_runtime.environment.failures.format_exception_with_response_body`), prefixed with the error's
    class name when ``name_error_type`` is set, and bounded to 2000 characters. ``terminal`` defaults to
    ``not is_retryable_dependency_error(error)``; pass it only where the stage decides on its own. ``fields``
    retain partial evidence for the response adapter, such as a partial response.
    """
    reason = format_exception_with_response_body(error, response_body)
    if name_error_type:
        reason = f"{type(error).__name__}: {reason}"
    event = FailureEvent(
        kind=failure_kind or DEPENDENCY_FAILED,
        stage=stage,
        reason=bound_reason(reason),
        error_type=type(error).__name__[:128],
    )
    if terminal is None:
        terminal = not is_retryable_dependency_error(error)
    return HandledEpisodeFailure(event, terminal=terminal, evidence=fields, dependency=True)


def unhandled_episode_failure(error: BaseException, *, stage: str = "episode") -> HandledEpisodeFailure:
    """A protocol raised something it did not handle: terminal, with the class and a bounded message only."""
    message = format_exception_with_response_body(error)
    event = FailureEvent(
        kind=UNHANDLED_EXCEPTION,
        stage=stage,
        reason=bound_reason(f"{type(error).__name__}: {message}"),
        error_type=type(error).__name__[:128],
    )
    return HandledEpisodeFailure(event, terminal=True)


def _json_evidence(evidence: Mapping[str, Any]) -> dict[str, JsonValue]:
    """Evidence crosses the wire: keep JSON values as they are, describe anything else by a bounded repr."""
    try:
        return _EVIDENCE.validate_python(dict(evidence))
    except ValidationError:
        return {str(k): v if _is_json(v) else repr(v)[:500] for k, v in evidence.items()}


def _is_json(value: Any) -> bool:
    try:
        _EVIDENCE.validate_python({"v": value})
    except ValidationError:
        return False
    return True
