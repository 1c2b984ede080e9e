"""A probe loop: probe each target on its period, feed its HealthState, report rounds and transitions.

The I/O shell around the pure state machine. The runtime's LocalShardSource and the operator both use it, so a
shard's phase means the same thing wherever it is computed. Time comes from the event loop (``loop.time()`` and
``asyncio.sleep``), so tests can drive it with looptime instead of waiting.

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
from typing import Final, Generic, TypeVar

from rollout_runtime.health.hysteresis import HealthState, ProbeResult, ProbeSettings, Transition
from rollout_runtime.health.probe import Prober

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


@dataclass(frozen=True)
class ProbeRound(Generic[NameT]):
    """The results of the probes that ran together, and the phase changes they caused (in target order)."""

    results: Mapping[NameT, ProbeResult]
    transitions: tuple[tuple[NameT, Transition], ...] = ()


TransitionCallback = Callable[[NameT, Transition, ProbeResult | None], Awaitable[None] | None]
"""Called as ``callback(name, transition, result)``; ``result`` is None for drain changes. May be async."""


CLOCK_SLACK_SECONDS: Final[float] = 1e-6
"""What is due within this much of now is due now. A loop sleeping "until due" for a remainder below the clock's
resolution wakes at once without time moving, and would spin (looptime makes that easy to hit, real clocks too)."""


class HealthMonitor(Generic[NameT]):
    """Keeps one HealthState per target and probes each target every ``settings.period_seconds``.

    Targets can be replaced at any time (:meth:`set_targets`); a target whose name stays keeps its state (and
    takes new settings from the next observation), a new name starts Pending, a removed name is forgotten.
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
        self._limit = asyncio.Semaphore(max_concurrency)
        self._targets: dict[NameT, ProbeTarget[NameT]] = {}
        self._states: dict[NameT, HealthState] = {}
        self._due: dict[NameT, float] = {}
        self._last_ok_at: dict[NameT, float] = {}
        self._changed = asyncio.Event()
        self._drain_changes: list[tuple[NameT, Transition]] = []
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
        operator restoring persisted status) or Pending; removed names are forgotten. New names are probed at once.
        """
        new = {t.name: t for t in targets}
        seeds = initial_states or {}
        for name in list(self._targets):
            if name not in new:
                del self._targets[name], self._states[name]
                self._due.pop(name, None)
                self._last_ok_at.pop(name, None)
        for name, target in new.items():
            if name in self._states:
                self._states[name].settings = target.settings
            else:
                seeded = seeds.get(name)
                if seeded is not None:
                    seeded.settings = target.settings
                self._states[name] = seeded if seeded is not None else HealthState(target.settings)
                self._due[name] = float("-inf")  # probe new targets at once
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

    async def _probe_one(self, target: ProbeTarget[NameT]) -> ProbeResult:
        async with self._limit:
            return await self._prober.probe(target.endpoint, target.settings, expected_model=target.expected_model)

    async def probe_round(self, names: Iterable[NameT] | None = None) -> ProbeRound[NameT]:
        """Probe the named targets (all by default) concurrently, once; record and report the outcome."""
        chosen = [self._targets[n] for n in (self._targets if names is None else names) if n in self._targets]
        results = await asyncio.gather(*(self._probe_one(t) for t in chosen))
        transitions: list[tuple[NameT, Transition]] = []
        for target, result in zip(chosen, results, strict=True):
            state = self._states.get(target.name)
            if state is None or self._targets.get(target.name) is not target:
                continue  # removed or replaced while the probe was in flight
            if result.ok:
                self._last_ok_at[target.name] = result.at
            transition = state.observe(result)
            if transition is not None:
                transitions.append((target.name, transition))
                await self._notify(target.name, transition, result)
        return ProbeRound(
            results={t.name: r for t, r in zip(chosen, results, strict=True)}, transitions=tuple(transitions)
        )

    async def rounds(self) -> AsyncIterator[ProbeRound[NameT]]:
        """Forever: wait until some targets are due, probe them together, yield the round.

        Drain changes are yielded at once as a round without results.

        Each target's next probe is due one period after its previous one *started*, so a slow probe does not
        stretch the period. With equal settings all targets fall into the same rounds.
        """
        loop = asyncio.get_running_loop()
        while True:
            if self._drain_changes:  # report drain changes at once, without waiting for a probe
                changes, self._drain_changes = tuple(self._drain_changes), []
                yield ProbeRound(results={}, transitions=changes)
            now = loop.time()
            due = [name for name, at in self._due.items() if at <= now + CLOCK_SLACK_SECONDS]
            if not due:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):  # an absolute wake-up: no remainder to round away
                    async with asyncio.timeout_at(min(self._due.values(), default=now + 3600.0)):
                        await self._changed.wait()
                continue
            for name in due:
                self._due[name] = now + self._targets[name].settings.period_seconds
            yield await self.probe_round(due)

    async def _notify(self, name: NameT, transition: Transition, result: ProbeResult | None) -> None:
        if self._on_transition is None:
            return
        try:
            outcome = self._on_transition(name, transition, result)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:  # a broken observer must not stop the probes that keep traffic safe
            log.exception("transition callback failed for %s (%s)", name, transition)
