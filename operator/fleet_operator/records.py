"""What the operator knows of each object, from its watch events: pure (no I/O, no clock; callers pass the time).

One record per GenerationShard and EnvironmentServer (a *target*: it is probed) and per RolloutFleet. A watch
event's body is read once (:func:`observe_target`, :func:`observe_fleet`) into what the engine uses: the validated
spec or why it is invalid, the endpoint to probe, the labels fleets select by, and the persisted status a new record
resumes from (what was last written, and the health it had: :func:`restored_state`). :class:`Records` keeps the
tables and says what an update changed, so the engine knows when to resync the probe list and which fleets to
rewrite. The engine (:mod:`fleet_operator.engine`) feeds it and does the I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, TypeVar

from pydantic import ValidationError

from fleet_operator.decisions import ENVIRONMENT_SERVER, GENERATION_SHARD, ROLLOUT_FLEET, Member, resolve_endpoint
from fleet_operator.discovery import PodMember, target_name
from fleet_operator.schedule import WriteState
from rollout_runtime.health import HealthPhase, HealthState, ProbeTarget, ProbeTargetPolicy
from rollout_runtime.kube.api import (
    EnvironmentServerSpec,
    GenerationShardSpec,
    RolloutFleetSpec,
    RolloutFleetStatus,
    ShardStatus,
)
from rollout_runtime.redaction import safe_message

__all__ = [
    "FleetKey",
    "FleetObservation",
    "FleetRecord",
    "Record",
    "Records",
    "TargetKey",
    "TargetObservation",
    "TargetRecord",
    "TargetSpec",
    "TargetUpdate",
    "expected_model",
    "observe_fleet",
    "observe_member",
    "observe_target",
    "parse_status",
    "restored_state",
]

TargetSpec = GenerationShardSpec | EnvironmentServerSpec

_SPEC_MODELS: Final[Mapping[str, type[GenerationShardSpec] | type[EnvironmentServerSpec]]] = {
    GENERATION_SHARD: GenerationShardSpec,
    ENVIRONMENT_SERVER: EnvironmentServerSpec,
}
_MAX_INVALID_CHARS: Final[int] = 1024


class TargetKey(NamedTuple):
    """A target's identity, and its name in the HealthMonitor. ``str(key)`` is ``Kind/namespace/name``."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


class FleetKey(NamedTuple):
    """A RolloutFleet's identity."""

    namespace: str
    name: str


@dataclass
class Record:
    """One object as the operator knows it (an ``ObjectRef`` for its Events), and its write state."""

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int | None
    write: WriteState = field(default_factory=WriteState)


@dataclass
class TargetRecord(Record):
    labels: dict[str, str] = field(default_factory=dict)
    spec: TargetSpec | None = None
    endpoint: str = ""
    invalid: str | None = None
    """Why the spec could not be used (an object that slipped past an older CRD); such a target is never probed."""
    fleet: str | None = None
    """A pod member's fleet (the only fleet that selects it); None for a GenerationShard/EnvironmentServer object."""
    member: str | None = None
    """A pod member's name in the healthy set (its pod's name)."""
    instance: str | None = None
    """A pod member's instance identity (:func:`fleet_operator.discovery.instance_identity`); set only by
    ``PodMembership._observe_instance``."""

    @property
    def derived(self) -> bool:
        """A pod member: no object of its own, so no status write and no Event of its own."""
        return self.fleet is not None

    @property
    def key(self) -> TargetKey:
        return TargetKey(self.kind, self.namespace, self.name)


@dataclass
class FleetRecord(Record):
    spec: RolloutFleetSpec | None = None
    invalid: str | None = None
    dirty_since: float | None = None
    """Loop time of the first change not yet written (the start of the coalescing window)."""

    @property
    def key(self) -> FleetKey:
        return FleetKey(self.namespace, self.name)


@dataclass(frozen=True)
class TargetObservation:
    """A GenerationShard or EnvironmentServer as one watch event shows it."""

    key: TargetKey
    uid: str
    generation: int | None
    labels: dict[str, str]
    spec: TargetSpec | None
    endpoint: str
    invalid: str | None
    status: Mapping[str, Any]
    """The persisted status ({} when there is none)."""
    fleet: str | None = None
    """Set for a pod member (see :attr:`TargetRecord.fleet`)."""
    member: str | None = None


@dataclass(frozen=True)
class FleetObservation:
    """A RolloutFleet as one watch event shows it."""

    key: FleetKey
    uid: str
    generation: int | None
    spec: RolloutFleetSpec | None
    invalid: str | None
    status: Mapping[str, Any]


def _invalid(exc: ValidationError) -> str:
    return safe_message(f"invalid spec: {exc.errors()[0].get('msg', exc)}", _MAX_INVALID_CHARS)


def observe_target(
    kind: str, body: Mapping[str, Any], cluster_domain: str, policy: ProbeTargetPolicy | None = None
) -> TargetObservation:
    """Read a target's event body; an invalid spec is recorded as such (the status says why), not raised.

    With ``policy``, an endpoint carrying a credential or naming a cluster Service of another namespace is such an
    invalid spec (:meth:`ProbeTargetPolicy.check_endpoint`): never probed, never published.
    """
    meta = body.get("metadata", {})
    key = TargetKey(kind, meta.get("namespace", ""), meta.get("name", ""))
    spec: TargetSpec | None
    try:
        spec = _SPEC_MODELS[kind].model_validate(body.get("spec") or {})
        invalid = None
        endpoint = resolve_endpoint(spec, key.namespace, cluster_domain)
    except ValidationError as exc:
        spec, endpoint, invalid = None, "", _invalid(exc)
    if spec is not None and policy is not None:
        verdict = policy.check_endpoint(endpoint, key.namespace)
        if not verdict.allowed:
            spec, endpoint, invalid = None, "", f"invalid spec: endpoint: {verdict.reason}"[:_MAX_INVALID_CHARS]
    return TargetObservation(
        key=key,
        uid=meta.get("uid", ""),
        generation=meta.get("generation"),
        labels=dict(meta.get("labels") or {}),
        spec=spec,
        endpoint=endpoint,
        invalid=invalid,
        status=body.get("status") or {},
    )


def observe_member(
    kind: str,
    namespace: str,
    fleet: str,
    member: PodMember,
    spec: TargetSpec,
    policy: ProbeTargetPolicy | None = None,
    *,
    status: Mapping[str, Any] | None = None,
) -> TargetObservation:
    """A pod member as a target observation. Its endpoint is a pod IP from the API: with ``policy`` it must pass the
    probe allowlist like any endpoint (forbidden ranges always refused, loopback only when allowed, other addresses
    only inside ``allowed_hosts``); a refused one is an invalid member, never probed or published."""
    key = TargetKey(kind, namespace, target_name(fleet, member.name))
    invalid = None
    if policy is not None:
        verdict = policy.check(member.endpoint + spec.probe.path, namespace=namespace)
        if not verdict.allowed:
            invalid = f"pod {member.name}: {verdict.reason}"[:_MAX_INVALID_CHARS]
    return TargetObservation(
        key=key,
        uid="",
        generation=None,
        labels=dict(member.labels),
        spec=spec if invalid is None else None,
        endpoint=member.endpoint if invalid is None else "",
        invalid=invalid,
        status=status or {},
        fleet=fleet,
        member=member.name,
    )


def observe_fleet(body: Mapping[str, Any]) -> FleetObservation:
    """Read a fleet's event body; an invalid spec is recorded as such, not raised."""
    meta = body.get("metadata", {})
    spec: RolloutFleetSpec | None
    try:
        spec, invalid = RolloutFleetSpec.model_validate(body.get("spec") or {}), None
    except ValidationError as exc:
        spec, invalid = None, _invalid(exc)
    return FleetObservation(
        key=FleetKey(meta.get("namespace", ""), meta.get("name", "")),
        uid=meta.get("uid", ""),
        generation=meta.get("generation"),
        spec=spec,
        invalid=invalid,
        status=body.get("status") or {},
    )


def expected_model(spec: TargetSpec | None) -> str | None:
    """The model a shard's probe must find served (None: any, or an environment server)."""
    return spec.model or None if isinstance(spec, GenerationShardSpec) else None


_M = TypeVar("_M", ShardStatus, RolloutFleetStatus)


def parse_status(model: type[_M], status: Mapping[str, Any] | None) -> _M | None:
    """A persisted or written status as its model (None: absent or not in the current schema)."""
    if not status:
        return None
    try:
        return model.model_validate(status)
    except ValidationError:
        return None


def restored_state(spec: TargetSpec, persisted: Mapping[str, Any]) -> HealthState | None:
    """The health a target had when its status was last written (None: start Pending)."""
    parsed = parse_status(ShardStatus, persisted)
    if parsed is None or parsed.phase is HealthPhase.PENDING:
        return None
    successes, failures = parsed.consecutive_successes, parsed.consecutive_failures
    if successes and failures:
        successes = 0
    return HealthState.restore(
        spec.probe,
        parsed.phase,
        consecutive_successes=successes,
        consecutive_failures=failures,
        draining=spec.drain,
        last_error=parsed.last_error,
        instance=parsed.instance,
        weights_version=parsed.weights_version,
    )


@dataclass(frozen=True)
class TargetUpdate:
    """What an upsert changed about a target."""

    record: TargetRecord
    probe_changed: bool
    """New, or its spec or endpoint changed: the probe list must be synced."""
    previous_spec: TargetSpec | None
    labels_changed: bool


class Records:
    """The targets and fleets the operator knows, by key."""

    def __init__(self) -> None:
        self.targets: dict[TargetKey, TargetRecord] = {}
        self.fleets: dict[FleetKey, FleetRecord] = {}

    def replaced(self, seen: TargetObservation | FleetObservation) -> bool:
        """Known under another uid: deleted and re-created while we were not looking, so a new object."""
        known: Record | None = (
            self.targets.get(seen.key) if isinstance(seen, TargetObservation) else self.fleets.get(seen.key)
        )
        return known is not None and known.uid != seen.uid

    def update_target(self, seen: TargetObservation, now: float) -> TargetUpdate:
        """Record what an event shows; a new record resumes from the persisted status (found at loop time ``now``)."""
        target = self.targets.get(seen.key)
        if target is None:
            kind, namespace, name = seen.key
            target = TargetRecord(kind=kind, namespace=namespace, name=name, uid=seen.uid, generation=seen.generation)
            target.write.found(seen.status, now)
            self.targets[seen.key] = target
            probe_changed = True
        else:
            probe_changed = (target.spec, target.endpoint) != (seen.spec, seen.endpoint)
        update = TargetUpdate(
            record=target,
            probe_changed=probe_changed,
            previous_spec=target.spec,
            labels_changed=target.labels != seen.labels,
        )
        target.labels, target.spec, target.endpoint = seen.labels, seen.spec, seen.endpoint
        target.generation, target.invalid = seen.generation, seen.invalid
        target.fleet, target.member = seen.fleet, seen.member
        return update

    def update_fleet(self, seen: FleetObservation, now: float) -> FleetRecord:
        """Record what an event shows; a change that matters to the status dirties the fleet at ``now``."""
        fleet = self.fleets.get(seen.key)
        if fleet is None:
            namespace, name = seen.key
            fleet = FleetRecord(kind=ROLLOUT_FLEET, namespace=namespace, name=name, uid=seen.uid, generation=None)
            fleet.write.found(seen.status, now)
            self.fleets[seen.key] = fleet
        if (fleet.spec, fleet.generation, fleet.invalid) != (seen.spec, seen.generation, seen.invalid):
            fleet.dirty_since = fleet.dirty_since or now
        fleet.spec, fleet.generation, fleet.invalid = seen.spec, seen.generation, seen.invalid
        return fleet

    def dirty_fleets(self, namespace: str, now: float) -> None:
        """A member in ``namespace`` changed: open the coalescing window of every fleet there that has none."""
        for fleet in self.fleets.values():
            if fleet.namespace == namespace and fleet.dirty_since is None:
                fleet.dirty_since = now

    def probe_targets(self) -> list[ProbeTarget[TargetKey]]:
        """What the HealthMonitor should probe: every target with a usable spec."""
        return [
            ProbeTarget(
                name=key,
                endpoint=t.endpoint,
                settings=t.spec.probe,
                expected_model=expected_model(t.spec) if t.spec.probe.check_model else None,
            )
            for key, t in self.targets.items()
            if t.spec is not None
        ]

    def restored_states(
        self, persisted: Mapping[TargetKey, Mapping[str, Any]], *, skip: Collection[TargetKey]
    ) -> dict[TargetKey, HealthState]:
        """The states new probe targets resume from, by key (targets in ``skip`` or without a spec start fresh)."""
        initial: dict[TargetKey, HealthState] = {}
        for key, status in persisted.items():
            target = self.targets.get(key)
            if key in skip or target is None or target.spec is None:
                continue
            state = restored_state(target.spec, status)
            if state is not None:
                initial[key] = state
        return initial

    def members(
        self, namespace: str, states: Mapping[TargetKey, HealthState], last_ok_at: Mapping[TargetKey, float]
    ) -> list[Member]:
        """What the fleets in ``namespace`` select from, with each member's health (Pending: not probed yet)."""
        members = []
        for key, target in self.targets.items():
            if target.namespace != namespace or target.spec is None:
                continue
            state = states.get(key)
            phase = state.phase if state is not None else HealthPhase.PENDING
            kind, _, name = key
            weights = state.weights_version if state is not None else None
            stale = state is not None and (state.stale or state.refitting)
            members.append(
                Member(
                    kind,
                    namespace,
                    target.member or name,
                    target.labels,
                    target.spec,
                    target.endpoint,
                    phase,
                    last_ok_at.get(key),
                    weights_version=weights,
                    stale=stale,
                    fleet=target.fleet,
                    instance=target.instance,
                )
            )
        return members

    def pod_members(self, namespace: str, fleet: str) -> dict[TargetKey, TargetRecord]:
        """The pod members of one fleet, by key."""
        return {key: t for key, t in self.targets.items() if t.fleet == fleet and t.namespace == namespace}
