"""Reconciliation decisions, pure: what a target's endpoint is, which members a fleet selects, what the statuses
and Events say, and whether a status is worth a write. :mod:`fleet_operator.schedule` says when to ask;
the engine (:mod:`fleet_operator.engine`) does the I/O around them.

Write policy (why the operator is cheap for the API server): a status is split into a *stable* part (phase,
endpoint, conditions, observedGeneration; for a fleet the healthy set, counts and conditions) and a *volatile*
part (latency, last probe time, consecutive counts, last error; a fleet's heartbeat time). A change of the stable
part is written at once (a transition); the volatile part rides along, or waits for the coalesced heartbeat.
So a steady fleet costs one write per target per heartbeat interval, never one per probe.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fleet_operator.conditions import find_condition, rfc3339, set_condition
from rollout_runtime.health import HealthPhase, HealthState, Transition
from rollout_runtime.kube import kinds
from rollout_runtime.kube.api import (
    EnvironmentServerEntry,
    EnvironmentServerSpec,
    GenerationShardSpec,
    HealthySetEntry,
    LabelSelector,
    RolloutFleetSpec,
    RolloutFleetStatus,
    ShardStatus,
    ShardWeights,
)
from rollout_runtime.redaction import redact_url, safe_message
from rollout_runtime.shards.model import Shard, revision_of

__all__ = [
    "ENVIRONMENT_SERVER",
    "FLEET_VOLATILE_KEYS",
    "GENERATION_SHARD",
    "ROLLOUT_FLEET",
    "SHARD_VOLATILE_KEYS",
    "EventNote",
    "Member",
    "fleet_revision",
    "fleet_status",
    "readiness_event",
    "resolve_endpoint",
    "selector_matches",
    "shard_status",
    "stable_part",
    "status_needs_write",
    "transition_event",
]

GENERATION_SHARD: Final[str] = kinds.GENERATION_SHARD.kind
ENVIRONMENT_SERVER: Final[str] = kinds.ENVIRONMENT_SERVER.kind
ROLLOUT_FLEET: Final[str] = kinds.ROLLOUT_FLEET.kind

SHARD_VOLATILE_KEYS: Final[frozenset[str]] = frozenset(
    {
        "latencyMilliseconds",
        "lastProbeTime",
        "lastSuccessTime",
        "consecutiveSuccesses",
        "consecutiveFailures",
        "lastError",
    }
)
FLEET_VOLATILE_KEYS: Final[frozenset[str]] = frozenset({"lastHeartbeatTime"})
_ENTRY_VOLATILE_KEYS: Final[frozenset[str]] = frozenset({"lastSuccessTime"})
_MAX_NAMES_IN_MESSAGE: Final[int] = 5


def resolve_endpoint(spec: GenerationShardSpec | EnvironmentServerSpec, namespace: str, cluster_domain: str) -> str:
    """The base URL to probe: the explicit endpoint, or the Service's cluster DNS name in the object's namespace."""
    if spec.endpoint is not None:
        return spec.endpoint
    assert spec.service_ref is not None  # the model guarantees exactly one
    ref = spec.service_ref
    return f"{ref.scheme}://{ref.name}.{namespace}.svc.{cluster_domain.strip('.')}:{ref.port}"


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: all matchLabels and all matchExpressions hold (empty selects all)."""
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for expression in selector.match_expressions:
        present = expression.key in labels
        if expression.operator == "In" and not (present and labels[expression.key] in expression.values):
            return False
        if expression.operator == "NotIn" and present and labels[expression.key] in expression.values:
            return False
        if expression.operator == "Exists" and not present:
            return False
        if expression.operator == "DoesNotExist" and present:
            return False
    return True


@dataclass(frozen=True)
class Member:
    """What a fleet needs to know of one probed target."""

    kind: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    spec: GenerationShardSpec | EnvironmentServerSpec
    endpoint: str
    phase: HealthPhase
    last_success_at: float | None = None
    """Wall-clock time of the latest successful probe, if any."""
    weights_version: int | None = None
    stale: bool = False
    """Stale or Refitting: restarted since its last refit (or being refit)."""
    fleet: str | None = None
    """A pod member's fleet: only that fleet selects it (its selectors do not apply)."""
    instance: str | None = None
    """A pod member's instance identity, published with it."""


def shard_status(
    state: HealthState,
    *,
    endpoint: str,
    generation: int | None,
    last_success_at: float | None,
    previous: ShardStatus | None,
    now: float,
) -> ShardStatus:
    """A target's status from its health state (conditions keep their transition times from ``previous``)."""
    phase = state.phase
    result = state.last_result
    serving = phase.serving
    if state.last_error is not None:
        last_error = safe_message(
            f"{state.last_reason.value if state.last_reason else 'error'}: {state.last_error}", 1024
        )
    else:
        last_error = None
    if serving:
        message = f"in the healthy set ({phase.value})"
    elif phase is HealthPhase.DRAINING:
        message = "draining: no new traffic"
    elif phase is HealthPhase.STALE:
        message = "stale: restarted (or a refit failed) since its last refit; no traffic until the trainer refits it"
    elif phase is HealthPhase.REFITTING:
        message = "refitting: weights being updated, no traffic"
    elif phase is HealthPhase.PENDING:
        message = f"waiting for {state.settings.success_threshold} consecutive successful probes"
    else:
        message = last_error or "probes failing"
    conditions = set_condition(
        previous.conditions if previous is not None else [],
        "Ready",
        "True" if serving else "False",
        phase.value,
        message,
        now=now,
        observed_generation=generation,
    )
    return ShardStatus(
        phase=phase,
        endpoint=redact_url(endpoint),
        consecutive_successes=state.consecutive_successes,
        consecutive_failures=state.consecutive_failures,
        last_error=last_error,
        latency_milliseconds=round(result.latency_seconds * 1000, 1) if result is not None else None,
        last_probe_time=rfc3339(result.at) if result is not None and result.at > 0 else None,
        last_success_time=rfc3339(last_success_at) if last_success_at else None,
        instance=state.instance,
        weights_version=state.weights_version,
        observed_generation=generation,
        conditions=conditions,
    )


def fleet_revision(shards: Sequence[HealthySetEntry], environment_servers: Sequence[EnvironmentServerEntry]) -> str:
    """Digest of the healthy set. Without environment servers it equals ``HealthySet.of(shards).revision``."""
    shard_revision = revision_of(_as_shard(entry) for entry in shards)
    if not environment_servers:
        return shard_revision
    payload = json.dumps(
        [shard_revision, [stable_part(e.to_kube(), frozenset()) for e in environment_servers]], sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _as_shard(entry: HealthySetEntry) -> Shard:
    return Shard(
        name=entry.name,
        endpoint=entry.endpoint,
        model=entry.model,
        max_model_len=entry.max_model_len,
        weight=entry.weight,
    )


def _names(members: Iterable[Member]) -> str:
    listed = sorted(members, key=lambda m: (m.kind, m.name))
    shown = ", ".join(f"{m.kind}/{m.name} ({m.phase.value})" for m in listed[:_MAX_NAMES_IN_MESSAGE])
    more = len(listed) - _MAX_NAMES_IN_MESSAGE
    return shown + (f" and {more} more" if more > 0 else "")


def selected_members(
    members: list[Member], kind: str, selector: LabelSelector | None, fleet: str | None
) -> list[Member]:
    """A fleet's members of ``kind``: objects its selector matches, then its own pod members with a name not taken."""
    objects = [
        m
        for m in members
        if m.kind == kind and m.fleet is None and selector is not None and selector_matches(selector, m.labels)
    ]
    taken = {m.name for m in objects}
    pods = [m for m in members if m.kind == kind and fleet is not None and m.fleet == fleet and m.name not in taken]
    return objects + pods


def fleet_status(
    spec: RolloutFleetSpec,
    members: Iterable[Member],
    *,
    generation: int | None,
    previous: RolloutFleetStatus | None,
    now: float,
    fleet: str | None = None,
    policy_version: int | None = None,
) -> RolloutFleetStatus:
    """The fleet's status from its selected members (callers pass only members in the fleet's namespace) and the
    trainer's ``policy_version`` (from the fleet's PolicyVersion).

    ``fleet``: the fleet's name, which selects its pod members (:attr:`Member.fleet`). A pod member named like a
    GenerationShard or EnvironmentServer the fleet also selects is left out: names in the healthy set are unique.
    """
    members = list(members)
    shards = selected_members(members, GENERATION_SHARD, spec.shard_selector, fleet)
    environments = selected_members(members, ENVIRONMENT_SERVER, spec.environment_server_selector, fleet)
    healthy_shards = sorted((m for m in shards if m.phase.serving), key=lambda m: m.name)
    healthy_envs = sorted((m for m in environments if m.phase.serving), key=lambda m: m.name)
    shard_entries = [
        HealthySetEntry(
            name=m.name,
            endpoint=m.endpoint,
            model=m.spec.model if isinstance(m.spec, GenerationShardSpec) else "",
            max_model_len=m.spec.max_model_len if isinstance(m.spec, GenerationShardSpec) else None,
            weight=m.spec.weight,
            last_success_time=rfc3339(m.last_success_at) if m.last_success_at else None,
            instance=m.instance,
        )
        for m in healthy_shards
    ]
    env_entries = [
        EnvironmentServerEntry(
            name=m.name,
            endpoint=m.endpoint,
            protocol=m.spec.protocol if isinstance(m.spec, EnvironmentServerSpec) else "",
            max_concurrent_episodes=(
                m.spec.max_concurrent_episodes if isinstance(m.spec, EnvironmentServerSpec) else None
            ),
            episode_timeout_seconds=(
                m.spec.episode_timeout_seconds if isinstance(m.spec, EnvironmentServerSpec) else None
            ),
            weight=m.spec.weight,
            instance=m.instance,
        )
        for m in healthy_envs
    ]
    conditions = list(previous.conditions) if previous is not None else []
    ready = len(healthy_shards) >= spec.min_ready_shards
    conditions = set_condition(
        conditions,
        "Ready",
        "True" if ready else "False",
        "EnoughHealthyShards" if ready else "NotEnoughHealthyShards",
        f"{len(healthy_shards)} of {len(shards)} shards healthy; minReadyShards is {spec.min_ready_shards}",
        now=now,
        observed_generation=generation,
    )
    sick = [m for m in (*shards, *environments) if not m.phase.serving]
    conditions = set_condition(
        conditions,
        "Degraded",
        "True" if sick else "False",
        "MembersNotHealthy" if sick else "AllMembersHealthy",
        f"not in the healthy set: {_names(sick)}" if sick else f"all {len(shards) + len(environments)} members healthy",
        now=now,
        observed_generation=generation,
    )
    return RolloutFleetStatus(
        revision=fleet_revision(shard_entries, env_entries),
        healthy=f"{len(healthy_shards)}/{len(shards)}",
        ready_shards=len(healthy_shards),
        total_shards=len(shards),
        stale_shards=sum(1 for m in shards if m.stale),
        policy_version=policy_version,
        shard_weights=[
            ShardWeights(name=m.name, weights_version=m.weights_version, stale=m.stale)
            for m in sorted(shards, key=lambda m: m.name)
        ],
        ready_environment_servers=len(healthy_envs),
        total_environment_servers=len(environments),
        shards=shard_entries,
        environment_servers=env_entries,
        observed_generation=generation,
        last_heartbeat_time=rfc3339(now),
        conditions=conditions,
    )


def stable_part(status: Mapping[str, Any], volatile: frozenset[str]) -> dict[str, Any]:
    """The status without its volatile keys (and without them inside healthy-set entries)."""
    out: dict[str, Any] = {}
    for key, value in status.items():
        if key in volatile:
            continue
        if key in ("shards", "environmentServers") and isinstance(value, list):
            value = [
                {k: v for k, v in entry.items() if k not in _ENTRY_VOLATILE_KEYS} if isinstance(entry, dict) else entry
                for entry in value
            ]
        out[key] = value
    return out


def status_needs_write(
    last_written: Mapping[str, Any] | None,
    desired: Mapping[str, Any],
    volatile: frozenset[str],
    *,
    heartbeat_due: bool,
) -> bool:
    """Write when the stable part changed (a transition), or on a due heartbeat when anything changed."""
    if last_written is None:
        return True
    if stable_part(last_written, volatile) != stable_part(desired, volatile):
        return True
    return heartbeat_due and dict(last_written) != dict(desired)


@dataclass(frozen=True)
class EventNote:
    """A Kubernetes Event to post about an object (best effort: its status already says the same)."""

    type_: str
    reason: str
    message: str


def transition_event(transition: Transition) -> EventNote:
    """A target's phase change: ``Became<Phase>``, a Warning when it stops serving or starts failing."""
    bad = transition.to_phase in (HealthPhase.UNHEALTHY, HealthPhase.SUSPECT)
    detail = f": {safe_message(transition.message, 1024)}" if transition.message else ""
    return EventNote(
        type_="Warning" if bad else "Normal",
        reason=f"Became{transition.to_phase.value}",
        message=f"{transition.from_phase.value} -> {transition.to_phase.value} ({transition.reason}){detail}",
    )


def readiness_event(before: RolloutFleetStatus | None, after: RolloutFleetStatus) -> EventNote | None:
    """``FleetReady`` / ``FleetNotReady`` when a written fleet status flips its Ready condition (None: no flip)."""

    def ready(status: RolloutFleetStatus | None) -> str | None:
        found = find_condition(status.conditions, "Ready") if status else None
        return found.status if found else None

    if ready(before) == ready(after):
        return None
    return EventNote(
        type_="Normal" if ready(after) == "True" else "Warning",
        reason="FleetReady" if ready(after) == "True" else "FleetNotReady",
        message=f"{after.healthy} shards healthy (revision {after.revision})",
    )
