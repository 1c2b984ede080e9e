"""The status writer: what the operator writes (target and fleet statuses, Events), coalesced.

It follows :mod:`fleet_operator.schedule` (when, in what order, retries) and :mod:`fleet_operator.decisions` (what
the statuses say, whether they need a write): target statuses at once on a phase change and otherwise on a
heartbeat; fleet statuses ``fleet_coalesce_seconds`` after the first change (a burst of shard transitions is one
write) and on a heartbeat. Failed writes are retried with backoff; a 404 means the object is gone and its record is
dropped (which also covers deletions missed while a watch was down). Probe rounds come in through
:meth:`StatusWriter.observe_round`: metrics, and a transition's Event and dirty fleets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from fleet_operator.decisions import (
    ENVIRONMENT_SERVER,
    FLEET_VOLATILE_KEYS,
    GENERATION_SHARD,
    ROLLOUT_FLEET,
    SHARD_VOLATILE_KEYS,
    EventNote,
    fleet_status,
    readiness_event,
    shard_status,
    transition_event,
)
from fleet_operator.kube import KubeApi, StatusWriteError, WriteOutcome
from fleet_operator.records import FleetRecord, Record, TargetKey, TargetRecord, parse_status
from fleet_operator.schedule import MAX_IN_FLIGHT_WRITES, PASS_ORDER, Sweep, TargetWrite, WriteSchedule
from fleet_operator.targets import Targets
from rollout_runtime.health import CLOCK_SLACK_SECONDS, HealthPhase, ProbeRound, Transition
from rollout_runtime.kube import kinds
from rollout_runtime.kube.api import RolloutFleetStatus, ShardStatus

__all__ = ["PLURALS", "StatusWriter"]

log = logging.getLogger(__name__)

PLURALS: Final[dict[str, str]] = {kind: names.plural for kind, names in kinds.BY_KIND.items()}
_MAX_PENDING_EVENTS: Final[int] = 1000


@dataclass(frozen=True)
class _Event:
    ref: Record
    note: EventNote


class StatusWriter:
    """Statuses and Events of every record in ``targets`` (see the module docstring)."""

    def __init__(
        self,
        targets: Targets,
        api: KubeApi,
        schedule: WriteSchedule,
        *,
        policy_version: Callable[[str, str], int | None],
        wall_clock: Callable[[], float],
    ) -> None:
        self._targets = targets
        self._api = api
        self._schedule = schedule
        self._policy_version = policy_version
        self._wall = wall_clock
        self._metrics = targets.metrics
        self._events: deque[_Event] = deque(maxlen=_MAX_PENDING_EVENTS)
        self.writes: dict[str, int] = {GENERATION_SHARD: 0, ENVIRONMENT_SERVER: 0, ROLLOUT_FLEET: 0}
        """Status writes made, by kind (also exported as fleet_status_writes_total)."""

    def observe_round(self, probe_round: ProbeRound[TargetKey]) -> None:
        """A probe round's results as metrics; its transitions as Events and dirty fleets."""
        for key, result in probe_round.results.items():
            self._metrics.probe_duration_seconds.labels(key.kind).observe(result.latency_seconds)
            if not result.ok:
                self._metrics.probe_failures_total.labels(key.kind, result.reason.value).inc()
        for key, transition in probe_round.transitions:
            if key in self._targets.records.targets:
                self._on_transition(key, transition)
        if probe_round.transitions:
            self._targets.wake.set()

    def _on_transition(self, key: TargetKey, transition: Transition) -> None:
        target = self._targets.records.targets[key]
        self._metrics.health_transitions_total.labels(
            key.kind, transition.from_phase.value, transition.to_phase.value
        ).inc()
        self._metrics.shard_healthy.labels(key.namespace, key.kind, key.name).set(
            1 if transition.to_phase.serving else 0
        )
        note = transition_event(transition)
        if not target.derived:  # a pod member has no object of its own: its fleet's conditions name it
            self._events.append(_Event(ref=target, note=note))
        self._targets.dirty(key.namespace)
        log.info("%s %s/%s: %s", *key, note.message)

    async def run(self, retry_seconds: float) -> None:
        """Write whenever something is due or the targets wake the writer, until cancelled."""
        wake = self._targets.wake
        loop = asyncio.get_running_loop()
        while True:
            wake.clear()
            try:
                next_due = await self.write_pass(loop.time() + CLOCK_SLACK_SECONDS)  # see CLOCK_SLACK_SECONDS
            except Exception:  # a surprise in one pass must not end reconciliation; the next pass retries
                log.exception("status write pass failed; retrying")
                next_due = loop.time() + retry_seconds
            with contextlib.suppress(TimeoutError):  # an absolute wake-up: no remainder to round away
                async with asyncio.timeout_at(next_due):
                    await wake.wait()

    async def write_pass(self, now: float) -> float:
        """One writer pass at loop time ``now``, in :data:`~fleet_operator.schedule.PASS_ORDER`: transitions, then
        fleets (once primed), then heartbeats; then Events.

        Each target sweep keeps up to ``MAX_IN_FLIGHT_WRITES`` PATCHes in flight.

        Returns the loop time by which the next pass is due (a heartbeat, a coalescing window, a retry).
        """
        records = self._targets.records
        next_due = now + self._schedule.heartbeat_seconds
        for sweep in PASS_ORDER:
            if sweep is Sweep.FLEETS:
                if self._targets.synced.is_set():
                    for fleet in list(records.fleets.values()):
                        next_due = min(next_due, await self._maybe_write_fleet(fleet, now))
                continue
            writes: list[tuple[TargetRecord, dict[str, Any]]] = []
            checked: list[tuple[TargetKey, TargetRecord]] = []
            for key, target in list(records.targets.items()):
                if target.write.retrying(now):
                    next_due = min(next_due, target.write.retry_at)
                    continue
                desired = self._target_status(key, target)
                if desired is None:
                    continue
                checked.append((key, target))
                action = self._schedule.target_write(target.write, desired, SHARD_VOLATILE_KEYS, now, sweep=sweep)
                if action is TargetWrite.WRITE:
                    writes.append((target, desired))
                elif action is TargetWrite.CHECKED:
                    target.write.written_at = now  # nothing new to say until the next heartbeat
            await self._write_all(writes, now)
            if sweep is Sweep.HEARTBEATS:
                for key, target in checked:
                    if key in records.targets:
                        next_due = min(next_due, self._schedule.target_next_due(target.write))
        await self._post_events()
        return next_due

    async def _write_all(self, writes: list[tuple[TargetRecord, dict[str, Any]]], now: float) -> None:
        """Write target statuses with up to ``MAX_IN_FLIGHT_WRITES`` PATCHes in flight."""
        if len(writes) <= 1:
            for target, desired in writes:
                await self._write(target, desired, now)
            return
        limit = asyncio.Semaphore(MAX_IN_FLIGHT_WRITES)

        async def one(target: TargetRecord, desired: dict[str, Any]) -> None:
            async with limit:
                await self._write(target, desired, now)

        async with asyncio.TaskGroup() as group:  # a surprise in one write cancels the rest; the pass is retried
            for target, desired in writes:
                group.create_task(one(target, desired))

    def _target_status(self, key: TargetKey, target: TargetRecord) -> dict[str, Any] | None:
        if target.derived:
            return None  # a pod member: published in its fleet's status only
        previous = parse_status(ShardStatus, target.write.written)
        if target.spec is None:
            if target.invalid is None:
                return None
            return ShardStatus(
                phase=HealthPhase.PENDING, last_error=target.invalid, observed_generation=target.generation
            ).model_dump(mode="json", by_alias=True)
        monitor = self._targets.monitor
        state = monitor.states.get(key)
        if state is None:
            return None
        self._metrics.shard_healthy.labels(target.namespace, target.kind, target.name).set(1 if state.serving else 0)
        status = shard_status(
            state,
            endpoint=target.endpoint,
            generation=target.generation,
            last_success_at=monitor.last_ok_at.get(key),
            previous=previous,
            now=self._wall(),
        )
        return status.model_dump(mode="json", by_alias=True)

    async def _maybe_write_fleet(self, fleet: FleetRecord, now: float) -> float:
        wait = self._schedule.fleet_wait(fleet.write, fleet.dirty_since, now)
        if wait is not None:
            return wait
        heartbeat_due = self._schedule.heartbeat_due(fleet.write, now)
        fleet.dirty_since = None
        if fleet.spec is None:
            return self._schedule.fleet_next_due(fleet.write, now)
        before = parse_status(RolloutFleetStatus, fleet.write.written)
        monitor = self._targets.monitor
        status = fleet_status(
            fleet.spec,
            self._targets.records.members(fleet.namespace, monitor.states, monitor.last_ok_at),
            generation=fleet.generation,
            previous=before,
            now=self._wall(),
            fleet=fleet.name,
            policy_version=self._policy_version(fleet.namespace, fleet.name),
        )
        desired = status.model_dump(mode="json", by_alias=True)
        self._metrics.healthy_shards.labels(fleet.namespace, fleet.name).set(status.ready_shards)
        self._metrics.shards.labels(fleet.namespace, fleet.name).set(status.total_shards)
        if fleet.write.needs_write(desired, FLEET_VOLATILE_KEYS, heartbeat_due=heartbeat_due) and await self._write(
            fleet, desired, now
        ):
            note = readiness_event(before, status)
            if note is not None:
                self._events.append(_Event(ref=fleet, note=note))
        return self._schedule.fleet_next_due(fleet.write, now)

    async def _write(self, record: Record, desired: dict[str, Any], now: float) -> bool:
        try:
            outcome = await self._api.patch_status(PLURALS[record.kind], record.namespace, record.name, desired)
        except StatusWriteError as exc:
            delay = record.write.failed(now, self._schedule.retry_seconds)
            level = logging.WARNING if exc.transient else logging.ERROR  # ERROR: RBAC or the CRD needs a fix
            log.log(level, "status write failed, retrying in %.1f s: %s", delay, exc)
            return False
        if outcome is WriteOutcome.GONE:
            log.info("%s %s/%s is gone; forgetting it", record.kind, record.namespace, record.name)
            if isinstance(record, FleetRecord):
                self._targets.forget_fleet(record.key)
            elif isinstance(record, TargetRecord):
                self._targets.forget(record.key)
            return False
        record.write.succeeded(desired, now)
        self.writes[record.kind] += 1
        self._metrics.status_writes_total.labels(record.kind).inc()
        return True

    async def _post_events(self) -> None:
        while self._events:
            event = self._events.popleft()
            try:
                await self._api.post_event(
                    event.ref, type_=event.note.type_, reason=event.note.reason, message=event.note.message
                )
            except StatusWriteError as exc:  # Events are best effort: the status already says it
                log.warning("could not post event %s: %s", event.note.reason, exc)
