"""The reconciliation engine: probes every target through the shared HealthMonitor and writes statuses, coalesced.

Fed by the kopf handlers (:meth:`FleetEngine.upsert`, :meth:`FleetEngine.forget`), it keeps one record per
GenerationShard, EnvironmentServer and RolloutFleet. Two tasks run while the operator leads:

- the probe loop drives ``HealthMonitor.rounds()`` (the runtime's one probe + hysteresis implementation) and turns
  results into metrics and transitions into Events and dirty marks;
- the writer decides, with the pure functions in :mod:`fleet_operator.decisions`, which statuses need a write:
  target statuses at once on a phase change and otherwise on a heartbeat; fleet statuses
  ``fleet_coalesce_seconds`` after the first change (a burst of shard transitions is one write) and on a
  heartbeat. Failed writes are retried with backoff; a 404 means the object is gone and its record is dropped
  (which also covers deletions missed while a watch was down).

Nothing is written at startup for objects whose persisted status is already right: a target resumes from its
persisted phase and counts (``HealthState.restore``), so a restarted or failed-over operator neither empties a
fleet's healthy set nor rewrites every status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from fleet_operator.decisions import (
    ENVIRONMENT_SERVER,
    FLEET_VOLATILE_KEYS,
    GENERATION_SHARD,
    SHARD_VOLATILE_KEYS,
    Member,
    fleet_status,
    resolve_endpoint,
    shard_status,
    status_needs_write,
)
from fleet_operator.kube import KubeApi, StatusWriteError, WriteOutcome
from fleet_operator.metrics import FleetMetrics
from fleet_operator.models import (
    EnvironmentServerSpec,
    GenerationShardSpec,
    RolloutFleetSpec,
    RolloutFleetStatus,
    ShardStatus,
)
from fleet_operator.settings import OperatorSettings
from rollout_runtime.health import (
    CLOCK_SLACK_SECONDS,
    HealthMonitor,
    HealthPhase,
    HealthState,
    Prober,
    ProbeRound,
    ProbeTarget,
    Transition,
)

__all__ = ["PLURALS", "ROLLOUT_FLEET", "FleetEngine", "TargetKey"]

log = logging.getLogger(__name__)

ROLLOUT_FLEET: Final[str] = "RolloutFleet"
PLURALS: Final[Mapping[str, str]] = {
    GENERATION_SHARD: "generationshards",
    ENVIRONMENT_SERVER: "environmentservers",
    ROLLOUT_FLEET: "rolloutfleets",
}
_SPEC_MODELS: Final[Mapping[str, type[GenerationShardSpec] | type[EnvironmentServerSpec]]] = {
    GENERATION_SHARD: GenerationShardSpec,
    ENVIRONMENT_SERVER: EnvironmentServerSpec,
}
_MAX_RETRY_SECONDS: Final[float] = 30.0
_MAX_PENDING_EVENTS: Final[int] = 1000
_WRITE_CONCURRENCY: Final[int] = 16
"""Status PATCHes one writer sweep keeps in flight: at 1,000 targets a sequential sweep takes minutes on a busy
apiserver (measured by bench/operator_scale.py), and a fleet's status must never wait that long."""

TargetKey = tuple[str, str, str]
"""(kind, namespace, name)."""


def _monitor_name(key: TargetKey) -> str:
    return "/".join(key)


def _compact(status: Mapping[str, Any]) -> dict[str, Any]:
    """A status as the API server keeps it after a merge patch: keys with null values are absent."""
    return {k: v for k, v in status.items() if v is not None}


@dataclass
class _Record:
    """What the writer remembers of one object: the last status it wrote (or found) and when."""

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int | None
    written: dict[str, Any] | None = None
    written_at: float = float("-inf")
    """Loop time the status was last written, or last found current on a heartbeat check."""
    retry_at: float = float("-inf")
    retry_delay: float = 0.0


@dataclass
class _Target(_Record):
    labels: dict[str, str] = field(default_factory=dict)
    spec: GenerationShardSpec | EnvironmentServerSpec | None = None
    endpoint: str = ""
    invalid: str | None = None
    """Why the spec could not be used (an object that slipped past an older CRD); such a target is never probed."""


@dataclass
class _Fleet(_Record):
    spec: RolloutFleetSpec | None = None
    invalid: str | None = None
    dirty_since: float | None = None


@dataclass(frozen=True)
class _Event:
    ref: _Record
    type_: str
    reason: str
    message: str


class FleetEngine:
    """Health reconciliation for every target and fleet this operator sees (see the module docstring)."""

    def __init__(
        self,
        settings: OperatorSettings,
        api: KubeApi,
        prober: Prober,
        *,
        metrics: FleetMetrics | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._api = api
        self._metrics = metrics if metrics is not None else FleetMetrics()
        self._wall = wall_clock
        self._monitor: HealthMonitor[str] = HealthMonitor([], prober, max_concurrency=settings.probe_concurrency)
        self._targets: dict[TargetKey, _Target] = {}
        self._fleets: dict[tuple[str, str], _Fleet] = {}
        self._events: deque[_Event] = deque(maxlen=_MAX_PENDING_EVENTS)
        self._wake = asyncio.Event()
        self._synced = asyncio.Event()
        self._priming: dict[TargetKey, Mapping[str, Any]] | None = None
        """While priming: new targets' persisted statuses, synced into the monitor once at the end."""
        self.writes: dict[str, int] = {GENERATION_SHARD: 0, ENVIRONMENT_SERVER: 0, ROLLOUT_FLEET: 0}
        """Status writes made, by kind (also exported as fleet_status_writes_total)."""

    # ------------------------------------------------------------------------------------------------------------
    # Inputs (called by the kopf handlers and at startup)

    @property
    def metrics(self) -> FleetMetrics:
        return self._metrics

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def prime(self) -> None:
        """List every object once before any fleet status is written.

        kopf lists the three kinds independently; without this, a fleet listed before its shards would publish
        an empty healthy set for a moment after every restart. Fleets are written only once primed.
        """
        namespaces: list[str | None] = list(self._settings.namespaces) or [None]
        self._priming = {}
        try:
            for kind in (GENERATION_SHARD, ENVIRONMENT_SERVER, ROLLOUT_FLEET):
                for namespace in namespaces:
                    for body in await self._list_with_retry(PLURALS[kind], namespace):
                        await self.upsert(kind, body)
        finally:
            primed, self._priming = self._priming, None
        # One probe-list sync for everything listed: one per object would be quadratic in the fleet size.
        self._sync_monitor(restore=primed)
        for key in primed:
            target = self._targets.get(key)
            if target is not None and target.spec is not None and target.spec.drain:
                await self._monitor.set_draining(_monitor_name(key), True)
        self._synced.set()
        self._wake.set()

    async def _list_with_retry(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        """List, retrying transient failures (429 while a new CRD's storage initialises, 5xx, lost connections)."""
        delay = self._settings.write_retry_seconds
        while True:
            try:
                return await self._api.list_objects(plural, namespace)
            except (ApiException, OSError, TimeoutError, aiohttp.ClientError) as exc:
                status = getattr(exc, "status", None)
                if isinstance(status, int) and status < 500 and status != 429:
                    raise  # 401/403/404: configuration or RBAC, not weather; fail loudly
                log.warning("listing %s failed (%s); retrying in %.1f s", plural, status or type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(_MAX_RETRY_SECONDS, delay * 2)

    async def upsert(self, kind: str, body: Mapping[str, Any]) -> None:
        """An object was listed, added or modified (our own status writes included: cheap when nothing changed)."""
        if kind == ROLLOUT_FLEET:
            self._upsert_fleet(body)
        else:
            await self._upsert_target(kind, body)
        self._wake.set()

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """An object was deleted."""
        if kind == ROLLOUT_FLEET:
            if self._fleets.pop((namespace, name), None) is not None:
                self._metrics.forget_fleet(namespace, name)
            return
        target = self._targets.pop((kind, namespace, name), None)
        if target is None:
            return
        self._sync_monitor()
        self._metrics.forget_target(namespace, kind, name)
        self._dirty_fleets(namespace)
        self._wake.set()

    async def _upsert_target(self, kind: str, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata", {})
        key: TargetKey = (kind, meta.get("namespace", ""), meta.get("name", ""))
        labels = dict(meta.get("labels") or {})
        generation = meta.get("generation")
        try:
            spec = _SPEC_MODELS[kind].model_validate(body.get("spec") or {})
            invalid = None
            endpoint = resolve_endpoint(spec, key[1], self._settings.cluster_domain)
        except ValidationError as exc:
            spec, endpoint = None, ""
            invalid = f"invalid spec: {exc.errors()[0].get('msg', exc)}"[:1024]
        target = self._targets.get(key)
        if target is not None and target.uid != meta.get("uid", ""):
            self.forget(*key)  # deleted and re-created while we were not looking: a new object
            target = None
        if target is None:
            target = _Target(kind=kind, namespace=key[1], name=key[2], uid=meta.get("uid", ""), generation=generation)
            persisted = body.get("status") or None
            if persisted:
                target.written = _compact(persisted)
                target.written_at = asyncio.get_running_loop().time()
            self._targets[key] = target
            changed_probe = True
        else:
            changed_probe = (target.spec, target.endpoint) != (spec, endpoint)
        old_labels, old_spec = target.labels, target.spec
        target.labels, target.spec, target.endpoint = labels, spec, endpoint
        target.generation, target.invalid = generation, invalid
        if changed_probe and self._priming is not None:
            self._priming[key] = body.get("status") or {}
        elif changed_probe:
            relocated = old_spec is not None and (
                target.endpoint != self._monitor.targets.get(_monitor_name(key), ProbeTarget("", "")).endpoint
                or _expected_model(old_spec) != _expected_model(spec)
            )
            self._sync_monitor(restore={key: body.get("status") or {}}, reset={key} if relocated else set())
        if spec is not None and _monitor_name(key) in self._monitor.states:
            # The monitor reports the resulting transition in its next round, like any other.
            await self._monitor.set_draining(_monitor_name(key), spec.drain)
        if changed_probe or old_labels != labels:
            self._dirty_fleets(key[1])

    def _upsert_fleet(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        try:
            spec: RolloutFleetSpec | None = RolloutFleetSpec.model_validate(body.get("spec") or {})
            invalid = None
        except ValidationError as exc:
            spec, invalid = None, f"invalid spec: {exc.errors()[0].get('msg', exc)}"[:1024]
        fleet = self._fleets.get(key)
        if fleet is not None and fleet.uid != meta.get("uid", ""):
            self.forget(ROLLOUT_FLEET, *key)
            fleet = None
        if fleet is None:
            fleet = _Fleet(kind=ROLLOUT_FLEET, namespace=key[0], name=key[1], uid=meta.get("uid", ""), generation=None)
            persisted = body.get("status") or None
            if persisted:
                fleet.written = _compact(persisted)
                fleet.written_at = asyncio.get_running_loop().time()
            self._fleets[key] = fleet
        if (fleet.spec, fleet.generation, fleet.invalid) != (spec, meta.get("generation"), invalid):
            fleet.dirty_since = fleet.dirty_since or asyncio.get_running_loop().time()
        fleet.spec, fleet.generation, fleet.invalid = spec, meta.get("generation"), invalid

    def _sync_monitor(
        self, *, restore: Mapping[TargetKey, Mapping[str, Any]] | None = None, reset: Iterable[TargetKey] = ()
    ) -> None:
        """Give the monitor the current target list; new targets resume from their persisted status."""
        reset = set(reset)
        if reset:  # a new endpoint or model is a new server: forget what the old one earned
            keep = [t for name, t in self._monitor.targets.items() if tuple(name.split("/", 2)) not in reset]
            self._monitor.set_targets(keep)
        wanted = [
            ProbeTarget(
                name=_monitor_name(key),
                endpoint=t.endpoint,
                settings=t.spec.probe,
                expected_model=_expected_model(t.spec),
            )
            for key, t in self._targets.items()
            if t.spec is not None
        ]
        known = set(self._monitor.states)
        initial: dict[str, HealthState] = {}
        for key, persisted in (restore or {}).items():
            name = _monitor_name(key)
            target = self._targets.get(key)
            if name in known or key in reset or target is None or target.spec is None:
                continue
            state = _restored_state(target.spec, persisted)
            if state is not None:
                initial[name] = state
        self._monitor.set_targets(wanted, initial_states=initial)

    def _dirty_fleets(self, namespace: str) -> None:
        now = asyncio.get_running_loop().time()
        for fleet in self._fleets.values():
            if fleet.namespace == namespace and fleet.dirty_since is None:
                fleet.dirty_since = now

    # ------------------------------------------------------------------------------------------------------------
    # The loops

    async def run(self) -> None:
        """Probe and write until cancelled (the operator's leadership term)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._probe_loop(), name="fleet-probe-loop")
            tasks.create_task(self._write_loop(), name="fleet-write-loop")

    async def _probe_loop(self) -> None:
        async with contextlib.aclosing(cast(AsyncGenerator[ProbeRound[str], None], self._monitor.rounds())) as rounds:
            async for probe_round in rounds:
                self._on_round(probe_round)

    async def probe_now(self) -> ProbeRound[str]:
        """Probe every target once, outside the schedule (tests, and ``rollout-fleet status --probe``)."""
        probe_round = await self._monitor.probe_round()
        self._on_round(probe_round)
        return probe_round

    def phase(self, kind: str, namespace: str, name: str) -> HealthPhase | None:
        """A target's current phase (None: unknown or never probed)."""
        state = self._monitor.states.get(_monitor_name((kind, namespace, name)))
        return state.phase if state is not None else None

    def _on_round(self, probe_round: ProbeRound[str]) -> None:
        for name, result in probe_round.results.items():
            kind = name.split("/", 1)[0]
            self._metrics.probe_duration_seconds.labels(kind).observe(result.latency_seconds)
            if not result.ok:
                self._metrics.probe_failures_total.labels(kind, result.reason.value).inc()
        for name, transition in probe_round.transitions:
            key = tuple(name.split("/", 2))
            if len(key) == 3 and key in self._targets:
                self._on_transition((key[0], key[1], key[2]), transition)
        if probe_round.transitions:
            self._wake.set()

    def _on_transition(self, key: TargetKey, transition: Transition) -> None:
        target = self._targets[key]
        self._metrics.health_transitions_total.labels(
            key[0], transition.from_phase.value, transition.to_phase.value
        ).inc()
        self._metrics.shard_healthy.labels(key[1], key[0], key[2]).set(1 if transition.to_phase.serving else 0)
        bad = transition.to_phase in (HealthPhase.UNHEALTHY, HealthPhase.SUSPECT)
        detail = f": {transition.message}" if transition.message else ""
        self._events.append(
            _Event(
                ref=target,
                type_="Warning" if bad else "Normal",
                reason=f"Became{transition.to_phase.value}",
                message=f"{transition.from_phase.value} -> {transition.to_phase.value} ({transition.reason}){detail}",
            )
        )
        self._dirty_fleets(key[1])
        log.info(
            "%s %s/%s: %s -> %s (%s)%s",
            *key,
            transition.from_phase.value,
            transition.to_phase.value,
            transition.reason,
            detail,
        )

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            try:
                next_due = await self.write_pass(loop.time() + CLOCK_SLACK_SECONDS)  # see CLOCK_SLACK_SECONDS
            except Exception:  # a surprise in one pass must not end reconciliation; the next pass retries
                log.exception("status write pass failed; retrying")
                next_due = loop.time() + self._settings.write_retry_seconds
            with contextlib.suppress(TimeoutError):  # an absolute wake-up: no remainder to round away
                async with asyncio.timeout_at(next_due):
                    await self._wake.wait()

    async def write_pass(self, now: float) -> float:
        """One writer pass at loop time ``now``: transitions first, then fleets, then heartbeats and events.

        Each target sweep keeps up to ``_WRITE_CONCURRENCY`` PATCHes in flight.

        Returns the loop time by which the next pass is due (a heartbeat, a coalescing window, a retry).
        """
        heartbeat = self._settings.status_heartbeat_seconds
        next_due = now + heartbeat
        # Targets' phase changes (stable part), then fleets, then targets' heartbeats: a fleet (what trainers read)
        # never waits behind a heartbeat wave. The PATCHes of one sweep overlap, bounded.
        for heartbeat_pass in (False, True):
            writes: list[tuple[_Target, dict[str, Any]]] = []
            checked: list[tuple[TargetKey, _Target]] = []
            for key, target in list(self._targets.items()):
                if target.retry_at > now:
                    next_due = min(next_due, target.retry_at)
                    continue
                due = heartbeat_pass and now - target.written_at >= heartbeat
                desired = self._target_status(key, target)
                if desired is None:
                    continue
                checked.append((key, target))
                if status_needs_write(target.written, _compact(desired), SHARD_VOLATILE_KEYS, heartbeat_due=due):
                    writes.append((target, desired))
                elif due:
                    target.written_at = now  # checked: nothing new to say until the next heartbeat
            await self._write_all(writes, now)
            if heartbeat_pass:
                for key, target in checked:
                    if key in self._targets:
                        next_due = min(next_due, max(target.written_at + heartbeat, target.retry_at))
            elif self._synced.is_set():
                for fleet in list(self._fleets.values()):
                    next_due = min(next_due, await self._maybe_write_fleet(fleet, now))
        await self._post_events()
        return next_due

    async def _write_all(self, writes: list[tuple[_Target, dict[str, Any]]], now: float) -> None:
        """Write target statuses with up to ``_WRITE_CONCURRENCY`` PATCHes in flight."""
        if len(writes) <= 1:
            for target, desired in writes:
                await self._write(target, desired, now)
            return
        limit = asyncio.Semaphore(_WRITE_CONCURRENCY)

        async def one(target: _Target, desired: dict[str, Any]) -> None:
            async with limit:
                await self._write(target, desired, now)

        async with asyncio.TaskGroup() as group:  # a surprise in one write cancels the rest; the pass is retried
            for target, desired in writes:
                group.create_task(one(target, desired))

    def _target_status(self, key: TargetKey, target: _Target) -> dict[str, Any] | None:
        previous = _parse(ShardStatus, target.written)
        if target.spec is None:
            if target.invalid is None:
                return None
            return ShardStatus(
                phase=HealthPhase.PENDING, last_error=target.invalid, observed_generation=target.generation
            ).model_dump(mode="json", by_alias=True)
        state = self._monitor.states.get(_monitor_name(key))
        if state is None:
            return None
        self._metrics.shard_healthy.labels(target.namespace, target.kind, target.name).set(1 if state.serving else 0)
        status = shard_status(
            state,
            endpoint=target.endpoint,
            generation=target.generation,
            last_success_at=self._monitor.last_ok_at.get(_monitor_name(key)),
            previous=previous,
            now=self._wall(),
        )
        return status.model_dump(mode="json", by_alias=True)

    async def _maybe_write_fleet(self, fleet: _Fleet, now: float) -> float:
        heartbeat = self._settings.status_heartbeat_seconds
        if fleet.retry_at > now:
            return fleet.retry_at
        coalesce_until = (fleet.dirty_since + self._settings.fleet_coalesce_seconds) if fleet.dirty_since else None
        if coalesce_until is not None and coalesce_until > now:
            return coalesce_until
        heartbeat_due = now - fleet.written_at >= heartbeat
        if coalesce_until is None and not heartbeat_due:
            return fleet.written_at + heartbeat
        fleet.dirty_since = None
        if fleet.spec is None:
            return now + heartbeat
        status = fleet_status(
            fleet.spec,
            self._members(fleet.namespace),
            generation=fleet.generation,
            previous=_parse(RolloutFleetStatus, fleet.written),
            now=self._wall(),
        )
        desired = status.model_dump(mode="json", by_alias=True)
        self._metrics.healthy_shards.labels(fleet.namespace, fleet.name).set(status.ready_shards)
        self._metrics.shards.labels(fleet.namespace, fleet.name).set(status.total_shards)
        if status_needs_write(fleet.written, _compact(desired), FLEET_VOLATILE_KEYS, heartbeat_due=heartbeat_due):
            before = _parse(RolloutFleetStatus, fleet.written)
            if await self._write(fleet, desired, now):
                self._fleet_ready_event(fleet, before, status)
        return fleet.retry_at if fleet.retry_at > now else now + heartbeat

    def _members(self, namespace: str) -> list[Member]:
        members = []
        for key, target in self._targets.items():
            if target.namespace != namespace or target.spec is None:
                continue
            state = self._monitor.states.get(_monitor_name(key))
            members.append(
                Member(
                    kind=target.kind,
                    namespace=target.namespace,
                    name=target.name,
                    labels=target.labels,
                    spec=target.spec,
                    endpoint=target.endpoint,
                    phase=state.phase if state is not None else HealthPhase.PENDING,
                    last_success_at=self._monitor.last_ok_at.get(_monitor_name(key)),
                )
            )
        return members

    def _fleet_ready_event(self, fleet: _Fleet, before: RolloutFleetStatus | None, after: RolloutFleetStatus) -> None:
        def ready(status: RolloutFleetStatus | None) -> str | None:
            found = next((c for c in status.conditions if c.type == "Ready"), None) if status else None
            return found.status if found else None

        if ready(before) != ready(after):
            self._events.append(
                _Event(
                    ref=fleet,
                    type_="Normal" if ready(after) == "True" else "Warning",
                    reason="FleetReady" if ready(after) == "True" else "FleetNotReady",
                    message=f"{after.healthy} shards healthy (revision {after.revision})",
                )
            )

    async def _write(self, record: _Record, desired: dict[str, Any], now: float) -> bool:
        try:
            outcome = await self._api.patch_status(PLURALS[record.kind], record.namespace, record.name, desired)
        except StatusWriteError as exc:
            record.retry_delay = min(
                _MAX_RETRY_SECONDS, max(self._settings.write_retry_seconds, record.retry_delay * 2)
            )
            record.retry_at = now + record.retry_delay
            log.warning("status write failed, retrying in %.1f s: %s", record.retry_delay, exc)
            return False
        if outcome is WriteOutcome.GONE:
            log.info("%s %s/%s is gone; forgetting it", record.kind, record.namespace, record.name)
            self.forget(record.kind, record.namespace, record.name)
            return False
        record.written, record.written_at = _compact(desired), now
        record.retry_at, record.retry_delay = float("-inf"), 0.0
        self.writes[record.kind] += 1
        self._metrics.status_writes_total.labels(record.kind).inc()
        return True

    async def _post_events(self) -> None:
        while self._events:
            event = self._events.popleft()
            try:
                await self._api.post_event(event.ref, type_=event.type_, reason=event.reason, message=event.message)
            except StatusWriteError as exc:  # Events are best effort: the status already says it
                log.warning("could not post event %s: %s", event.reason, exc)


def _expected_model(spec: GenerationShardSpec | EnvironmentServerSpec | None) -> str | None:
    return spec.model or None if isinstance(spec, GenerationShardSpec) else None


_M = TypeVar("_M", ShardStatus, RolloutFleetStatus)


def _parse(model: type[_M], status: Mapping[str, Any] | None) -> _M | None:
    if not status:
        return None
    try:
        return model.model_validate(status)
    except ValidationError:
        return None


def _restored_state(
    spec: GenerationShardSpec | EnvironmentServerSpec, persisted: Mapping[str, Any]
) -> HealthState | None:
    """The health a target had when its status was last written (None: start Pending)."""
    parsed = _parse(ShardStatus, persisted)
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
    )
