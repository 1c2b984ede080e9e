"""A probe loop: probe each target on its own timer, feed its HealthState, report results and transitions.

The I/O shell around the pure state machine (:mod:`.hysteresis`) and the pure schedule (:mod:`.schedule`). The
runtime's LocalShardSource and the operator both use it, so a shard's phase means the same thing wherever it is
computed. Time comes from the event loop (``loop.time()`` and ``asyncio`` timeouts), so tests can drive it with
looptime instead of waiting.

Every target has its own timer and its own deadline, as in Envoy's and HAProxy's per-host checkers: a target's
next probe is due one period after its previous probe started, whatever the other targets do, so a blackholed
target that takes its whole timeout delays nobody else. Probes share one global concurrency limit, a FIFO
semaphore taken in due order: under saturation a target waits behind the probes due before it (never behind a
whole round), whichever fleet they belong to. Per-fleet shares were not chosen: the monitor does not know fleets,
and FIFO already bounds every target's wait by the probes ahead of it.

Targets are keyed by any hashable name: the runtime uses shard names, the operator a typed (kind, namespace, name)
key, so nobody joins a key into a string to split it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, TypeVar

from rollout_runtime.health.hysteresis import HealthState, ProbeResult, ProbeSettings, Transition
from rollout_runtime.health.probe import Prober
from rollout_runtime.health.schedule import CLOCK_SLACK_SECONDS, ProbeSchedule

__all__ = ["CLOCK_SLACK_SECONDS", "HealthMonitor", "ProbeRound", "ProbeTarget", "TransitionCallback"]

log = logging.getLogger(__name__)

NameT = TypeVar("NameT", bound=Hashable)
"""A target's name: what the monitor keys its states by."""


@dataclass(frozen=True)
class ProbeTarget(Generic[NameT]):
    """Something to probe: a generation shard (``expected_model`` set) or an environment server (health only)."""

    name: NameT
    endpoint: str
    settings: ProbeSettings = field(default_factory=ProbeSettings)
    expected_model: str | None = None

    @property
    def server(self) -> tuple[str, str | None]:
        """What a probe result is about: a result for another endpoint or model says nothing of this target."""
        return self.endpoint, self.expected_model


@dataclass(frozen=True)
class ProbeRound(Generic[NameT]):
    """Probe results recorded together, and the phase changes they caused (in completion order).

    From :meth:`HealthMonitor.rounds`: the probes that completed since the consumer last asked (with a prompt
    consumer, those that completed at the same loop tick); from :meth:`HealthMonitor.probe_round`: one probe of
    each named target.
    """

    results: Mapping[NameT, ProbeResult]
    transitions: tuple[tuple[NameT, Transition], ...] = ()


TransitionCallback = Callable[[NameT, Transition, ProbeResult | None], Awaitable[None] | None]
"""Called as ``callback(name, transition, result)``; ``result`` is None for drain changes. May be async."""


class HealthMonitor(Generic[NameT]):
    """Keeps one HealthState per target and probes each target every ``settings.period_seconds``.

    Targets can be replaced at any time (:meth:`set_targets`); a target whose name stays keeps its state (and
    takes new settings from the next observation), a new name starts Pending, a removed name is forgotten and its
    probe in flight abandoned.
    """

    def __init__(
        self,
        targets: Iterable[ProbeTarget[NameT]],
        prober: Prober,
        *,
        on_transition: TransitionCallback[NameT] | None = None,
        max_concurrency: int = 64,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        self._prober = prober
        self._on_transition = on_transition
        self._limit = asyncio.Semaphore(max_concurrency)  # FIFO: waiters are served in the order they queued
        self._targets: dict[NameT, ProbeTarget[NameT]] = {}
        self._states: dict[NameT, HealthState] = {}
        self._schedule: ProbeSchedule[NameT] = ProbeSchedule()
        self._probes: dict[NameT, asyncio.Task[None]] = {}
        """Scheduled probes in flight (queued for a slot or running), one per target at most."""
        self._last_ok_at: dict[NameT, float] = {}
        self._changed = asyncio.Event()
        self._drain_changes: list[tuple[NameT, Transition]] = []
        self._completed: dict[NameT, ProbeResult] = {}
        self._completed_transitions: list[tuple[NameT, Transition]] = []
        # Read-only live views, made once: callers look up one key per member and pass, so a copy per access
        # would make a pass over N targets cost N copies of N entries. Copy one (``dict(...)``) to keep it.
        self._targets_view: Mapping[NameT, ProbeTarget[NameT]] = MappingProxyType(self._targets)
        self._states_view: Mapping[NameT, HealthState] = MappingProxyType(self._states)
        self._last_ok_at_view: Mapping[NameT, float] = MappingProxyType(self._last_ok_at)
        self.set_targets(targets)

    @property
    def targets(self) -> Mapping[NameT, ProbeTarget[NameT]]:
        """Name -> target, a live read-only view (it changes with :meth:`set_targets`)."""
        return self._targets_view

    @property
    def states(self) -> Mapping[NameT, HealthState]:
        """Name -> live HealthState, a live read-only view (read the states, do not feed them: the monitor does)."""
        return self._states_view

    @property
    def last_ok_at(self) -> Mapping[NameT, float]:
        """Name -> wall-clock time of the latest successful probe, for targets that ever answered (a live view)."""
        return self._last_ok_at_view

    def set_targets(
        self, targets: Iterable[ProbeTarget[NameT]], *, initial_states: Mapping[NameT, HealthState] | None = None
    ) -> None:
        """Replace the targets. Surviving names keep their state; new names start from ``initial_states`` (an
        operator restoring persisted status) or Pending; removed names are forgotten. New names are probed at once,
        and so are surviving names whose endpoint or model changed (their probe in flight is abandoned).
        """
        new = {t.name: t for t in targets}
        seeds = initial_states or {}
        for name in list(self._targets):
            if name not in new:
                del self._targets[name], self._states[name]
                self._abandon(name)
                self._schedule.remove(name)
                self._last_ok_at.pop(name, None)
        for name, target in new.items():
            if name in self._states:
                previous = self._targets[name]
                self._states[name].settings = target.settings
                if previous.server != target.server:
                    self._abandon(name)
                    self._schedule.reset(name)
                elif previous.settings.period_seconds != target.settings.period_seconds:
                    self._schedule.retime(name, target.settings.period_seconds)
            else:
                seeded = seeds.get(name)
                if seeded is not None:
                    seeded.settings = target.settings
                self._states[name] = seeded if seeded is not None else HealthState(target.settings)
                self._schedule.add(name)  # probe new targets at once
            self._targets[name] = target
        self._changed.set()

    async def set_draining(self, name: NameT, draining: bool) -> Transition | None:
        """Start or stop draining a target; the callback hears about the change."""
        transition = self._states[name].set_draining(draining)
        if transition is not None:
            self._drain_changes.append((name, transition))
            await self._notify(name, transition, None)
        self._changed.set()
        return transition

    async def change_state(self, name: NameT, change: Callable[[HealthState], Transition | None]) -> Transition | None:
        """Apply a change from outside the probes (a refit, restart evidence) to a target's state; like a drain
        change, a visible transition is reported at once (callback and the next round)."""
        transition = change(self._states[name])
        if transition is not None:
            self._drain_changes.append((name, transition))
            await self._notify(name, transition, None)
        self._changed.set()
        return transition

    def record_request_success(self, name: NameT) -> None:
        """A real request to the target completed: evidence of life (see :meth:`HealthState.request_succeeded`).

        Unknown names are ignored: a completion may land just after its shard was removed.
        """
        state = self._states.get(name)
        if state is not None:
            state.request_succeeded(asyncio.get_running_loop().time())

    async def probe_round(self, names: Iterable[NameT] | None = None) -> ProbeRound[NameT]:
        """Probe the named targets (all by default) concurrently, once, outside their schedules; record and report
        the outcome."""
        chosen = [self._targets[n] for n in (self._targets if names is None else names) if n in self._targets]
        results = await asyncio.gather(*(self._probe(t) for t in chosen))
        transitions: list[tuple[NameT, Transition]] = []
        for target, result in zip(chosen, results, strict=True):
            transition = await self._record(target, result)
            if transition is not None:
                transitions.append((target.name, transition))
        return ProbeRound(
            results={t.name: r for t, r in zip(chosen, results, strict=True)}, transitions=tuple(transitions)
        )

    async def rounds(self) -> AsyncIterator[ProbeRound[NameT]]:
        """Forever: start every target's probe when it is due, and yield what completed as a round.

        A probe's result is recorded (state, callback) the moment it completes, whatever the consumer is doing;
        the round reports it. Drain changes are yielded at once as a round without results. Probes in flight are
        abandoned when the iterator is closed.
        """
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._drain_changes:  # report drain changes at once, without waiting for a probe
                    changes, self._drain_changes = tuple(self._drain_changes), []
                    yield ProbeRound(results={}, transitions=changes)
                if self._completed:
                    results, self._completed = self._completed, {}
                    transitions, self._completed_transitions = tuple(self._completed_transitions), []
                    yield ProbeRound(results=results, transitions=transitions)
                for name in self._schedule.take_due(loop.time()):
                    self._probes[name] = loop.create_task(self._scheduled_probe(self._targets[name]))
                if self._drain_changes or self._completed:
                    continue
                self._changed.clear()
                due = self._schedule.next_due()
                with contextlib.suppress(TimeoutError):  # an absolute wake-up: no remainder to round away
                    async with asyncio.timeout_at(due if due is not None else loop.time() + 3600.0):
                        await self._changed.wait()
        finally:
            abandoned = [task for task in self._probes.values() if not task.done()]
            for name in list(self._probes):
                self._abandon(name)
            await asyncio.gather(*abandoned, return_exceptions=True)

    async def _scheduled_probe(self, target: ProbeTarget[NameT]) -> None:
        name = target.name
        try:
            result = await self._probe(target, scheduled=True)
            if self._current_state(target) is not None:
                transition = await self._record(target, result)
                self._completed[name] = result
                if transition is not None:
                    self._completed_transitions.append((name, transition))
        except Exception:  # a broken prober must not stop the other targets' probes; this one is due again
            log.exception("probe of %s failed", name)
        finally:
            if self._probes.get(name) is asyncio.current_task():
                del self._probes[name]
                self._schedule.finished(name, self._targets.get(name, target).settings.period_seconds)
            self._changed.set()

    async def _probe(self, target: ProbeTarget[NameT], *, scheduled: bool = False) -> ProbeResult:
        async with self._limit:
            if scheduled:
                self._schedule.started(target.name, asyncio.get_running_loop().time())
            settings = self._passive_settings(target)
            return await self._prober.probe(target.endpoint, settings, expected_model=target.expected_model)

    def _passive_settings(self, target: ProbeTarget[NameT]) -> ProbeSettings:
        """A generate probe skips its generation while real requests prove the engine generates: one completed
        within the last period. Timeouts after that are still excused only within the liveness window, so the
        bound of :class:`HealthState` holds with or without the skip."""
        settings = target.settings
        state = self._states.get(target.name)
        if not settings.generate or state is None or state.request_ok_at is None:
            return settings
        if asyncio.get_running_loop().time() - state.request_ok_at > settings.period_seconds:
            return settings
        return settings.model_copy(update={"generate": False})

    def _current_state(self, target: ProbeTarget[NameT]) -> HealthState | None:
        """The state a result for ``target`` feeds: None if the target was removed or now names another server."""
        current = self._targets.get(target.name)
        if current is None or current.server != target.server:
            return None
        return self._states.get(target.name)

    async def _record(self, target: ProbeTarget[NameT], result: ProbeResult) -> Transition | None:
        """Feed a result to its target's state (if it is still current) and tell the callback of a transition."""
        state = self._current_state(target)
        if state is None:
            return None
        if result.ok:
            self._last_ok_at[target.name] = result.at
        transition = state.observe(result, now=asyncio.get_running_loop().time())
        if transition is not None:
            await self._notify(target.name, transition, result)
        return transition

    def _abandon(self, name: NameT) -> None:
        """Cancel a target's scheduled probe in flight; a target still known is due a period after it started."""
        task = self._probes.pop(name, None)
        if task is not None:
            task.cancel()
            target = self._targets.get(name)
            if target is not None:
                self._schedule.finished(name, target.settings.period_seconds)

    async def _notify(self, name: NameT, transition: Transition, result: ProbeResult | None) -> None:
        if self._on_transition is None:
            return
        try:
            outcome = self._on_transition(name, transition, result)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:  # a broken observer must not stop the probes that keep traffic safe
            log.exception("transition callback failed for %s (%s)", name, transition)
