"""The embedded default shard source: the runtime probes its own shards, no Kubernetes needed.

Each shard gets a :class:`~rollout_runtime.health.HealthState` and its own probe timer; after every batch of
completed probes the source yields a :class:`HealthySet` of the shards that serve (Healthy or Suspect, not
draining), with the time of each shard's latest successful probe so the dispatcher can un-eject a passively ejected
shard. A shard leaves the set in the round that makes it Unhealthy.

The dispatcher reports completed attempts (:meth:`LocalShardSource.attempt_succeeded`): a shard that is
completing requests is alive, so probe timeouts alone do not take it out (passive liveness, in
:mod:`rollout_runtime.health.hysteresis`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from typing import cast

from rollout_runtime.health.hysteresis import HealthPhase, HealthState, ProbeSettings, Transition
from rollout_runtime.health.monitor import HealthMonitor, ProbeRound, ProbeTarget, TransitionCallback
from rollout_runtime.health.probe import HttpProber, Prober
from rollout_runtime.health.targets import ProbeTargetPolicy
from rollout_runtime.shards.model import DEFAULT_FLEET, HealthySet, Shard
from rollout_runtime.weights.identity import IdentitySource
from rollout_runtime.weights.tracker import WeightsTracker

__all__ = ["LocalShardSource"]


class LocalShardSource:
    """Probes ``shards`` every ``settings.period_seconds`` while :meth:`snapshots` is iterated.

    ``prober`` defaults to an :class:`HttpProber` owned (and closed) by the source, with ``policy``, which
    defaults to allowing exactly the configured shards' hosts (the caller configured them, so trusts them;
    metadata and link-local addresses stay refused). Iterate :meth:`snapshots` once at a time: each iteration
    runs the probe loop. ``fleet`` names the fleet in the dispatcher's ``rollout_*`` metrics (no namespace: the
    fleet is not a Kubernetes object).

    :attr:`weights` is the trainer's weights API for these shards (:class:`~rollout_runtime.weights.WeightsTracker`;
    the dispatcher reads it); with an ``identity`` source, every shard's instance identity is polled each probe
    period while :meth:`snapshots` is iterated, and a restart makes a refit shard Stale.
    """

    namespace = ""

    def __init__(
        self,
        shards: Iterable[Shard],
        settings: ProbeSettings | None = None,
        *,
        prober: Prober | None = None,
        policy: ProbeTargetPolicy | None = None,
        on_transition: TransitionCallback[str] | None = None,
        max_concurrency: int = 64,
        fleet: str = DEFAULT_FLEET,
        identity: IdentitySource | None = None,
        max_weights_lag: int = 0,
    ) -> None:
        self.fleet = fleet
        self._shards = tuple(shards)
        names = [s.name for s in self._shards]
        if len(set(names)) != len(names):
            raise ValueError(f"shard names must be unique, got {names}")
        self.settings = settings or ProbeSettings()
        self._owned_prober: HttpProber | None = None
        if prober is None:
            policy = policy or ProbeTargetPolicy.for_endpoints(s.endpoint for s in self._shards)
            prober = self._owned_prober = HttpProber(policy)
        elif policy is not None:
            raise ValueError("pass either a prober or a policy for the default prober, not both")
        self._iterating = False
        self._monitor = HealthMonitor(
            (ProbeTarget(s.name, s.endpoint, self.settings, self._checked_model(s)) for s in self._shards),
            prober,
            on_transition=on_transition,
            max_concurrency=max_concurrency,
        )
        self.weights = WeightsTracker(self, identity=identity, max_weights_lag=max_weights_lag)

    def endpoint_of(self, name: str) -> str:
        """The base URL of shard ``name`` (for the weights tracker's identity reads)."""
        return self._monitor.targets[name].endpoint

    async def change_state(self, name: str, change: Callable[[HealthState], Transition | None]) -> Transition | None:
        """Apply a weights change (refit, restart) to a shard's state; the next snapshot shows it at once."""
        if name not in self._monitor.states:
            raise KeyError(f"unknown shard {name!r}")
        return await self._monitor.change_state(name, change)

    def _checked_model(self, shard: Shard) -> str | None:
        """The model the probe requires in ``/v1/models``: only with ``settings.check_model`` (never implied)."""
        return shard.model or None if self.settings.check_model else None

    def not_ready_reasons(self) -> dict[str, str]:
        """Shard name -> why it is not serving (its phase and latest probe failure), for errors and logs."""
        reasons: dict[str, str] = {}
        for name, state in self._monitor.states.items():
            if state.serving:
                continue
            why = state.last_error or "no probe has completed yet"
            reasons[name] = f"{state.phase.value}: {why}"
        return reasons

    @property
    def shards(self) -> tuple[Shard, ...]:
        return self._shards

    @property
    def states(self) -> Mapping[str, HealthState]:
        """Shard name -> its live HealthState (phase, consecutive counts, last error), for display."""
        return self._monitor.states

    def phases(self) -> dict[str, HealthPhase]:
        """Shard name -> phase, in configuration order."""
        states = self._monitor.states
        return {s.name: states[s.name].phase for s in self._shards}

    def current(self) -> HealthySet:
        """The healthy set as of the latest probe round."""
        states = self._monitor.states
        ok_at = self._monitor.last_ok_at
        serving = [s for s in self._shards if states[s.name].serving]
        return HealthySet.of(serving, probe_ok_at={s.name: ok_at[s.name] for s in self._shards if s.name in ok_at})

    async def set_draining(self, name: str, draining: bool = True) -> Transition | None:
        """Stop (or resume) sending new traffic to a shard whatever its probes say; the next snapshot shows it."""
        if name not in self._monitor.states:
            raise KeyError(f"unknown shard {name!r}")
        return await self._monitor.set_draining(name, draining)

    def attempt_succeeded(self, name: str) -> None:
        """An attempt on shard ``name`` completed (the dispatcher calls this): evidence that the shard is alive."""
        self._monitor.record_request_success(name)

    async def snapshots(self) -> AsyncIterator[HealthySet]:
        """Probe forever; yield the healthy set after every round (and after every drain change)."""
        if self._iterating:
            raise RuntimeError("LocalShardSource.snapshots() is already being iterated: one probe loop per source")
        self._iterating = True
        try:
            rounds = cast(AsyncGenerator[ProbeRound[str], None], self._monitor.rounds())
            watcher = None
            if self.weights.identity is not None:
                watcher = asyncio.create_task(self.weights.watch(self.settings.period_seconds), name="identity-watch")
            try:
                async with contextlib.aclosing(rounds):  # closing it abandons the probes in flight
                    async for _round in rounds:
                        yield self.current()
            finally:
                if watcher is not None:
                    watcher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watcher
                await self.weights.aclose()
        finally:
            self._iterating = False
            if self._owned_prober is not None:
                await self._owned_prober.close()
