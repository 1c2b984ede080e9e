"""The state the engine's parts share: the records of what the operator knows and the monitor that probes them.

:class:`Targets` owns :class:`~fleet_operator.records.Records` (one record per GenerationShard, EnvironmentServer,
pod member and RolloutFleet), the runtime's :class:`~rollout_runtime.health.HealthMonitor` (the one probe +
hysteresis implementation) and the writer's wake-up. Every change of a target goes through it, so the probe list,
the drain flags and the fleets to rewrite follow each change in one place; the parts around it
(:mod:`fleet_operator.membership`, :mod:`fleet_operator.refits`, :mod:`fleet_operator.writer`) decide when.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fleet_operator.metrics import FleetMetrics
from fleet_operator.records import FleetKey, FleetObservation, Records, TargetKey, TargetObservation, expected_model
from rollout_runtime.health import HealthMonitor, HealthState, ProbeTarget, Transition

__all__ = ["Targets"]


class Targets:
    """Records, the probe monitor and the writer's wake-up (see the module docstring)."""

    def __init__(self, monitor: HealthMonitor[TargetKey], metrics: FleetMetrics) -> None:
        self.records = Records()
        self.monitor = monitor
        self.metrics = metrics
        self.wake = asyncio.Event()
        """Set when something may need writing: the writer's loop wakes up."""
        self.synced = asyncio.Event()
        """Set once every object was listed (:meth:`FleetEngine.prime`): fleets are written only after it."""
        self.priming: dict[TargetKey, Mapping[str, Any]] | None = None
        """While priming: new targets' persisted statuses, synced into the monitor once at the end."""

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def dirty(self, namespace: str) -> None:
        """Something the fleets in ``namespace`` publish changed: open their coalescing windows."""
        self.records.dirty_fleets(namespace, self.now())

    async def apply(self, seen: TargetObservation) -> None:
        """A target (an object, or a pod member) as an event shows it: record it and resync what depends on it."""
        key = seen.key
        if self.records.replaced(seen):
            self.forget(key)
        update = self.records.update_target(seen, self.now())
        if update.probe_changed and self.priming is not None:
            self.priming[key] = seen.status
        elif update.probe_changed:
            relocated = update.previous_spec is not None and (
                seen.endpoint != self.monitor.targets.get(key, ProbeTarget("", "")).endpoint
                or expected_model(update.previous_spec) != expected_model(seen.spec)
            )
            self.sync_monitor(restore={key: seen.status}, reset={key} if relocated else set())
        if seen.spec is not None and key in self.monitor.states:
            # The monitor reports the resulting transition in its next round, like any other.
            await self.monitor.set_draining(key, seen.spec.drain)
        if update.probe_changed or update.labels_changed:
            self.dirty(key.namespace)

    def forget(self, key: TargetKey) -> None:
        """A target is gone (its object deleted, or no longer a member)."""
        if self.records.targets.pop(key, None) is None:
            return
        self.sync_monitor()
        self.metrics.forget_target(key.namespace, key.kind, key.name)
        self.dirty(key.namespace)
        self.wake.set()

    def update_fleet(self, seen: FleetObservation) -> None:
        """A RolloutFleet as an event shows it (one re-created under the same name starts over)."""
        if self.records.replaced(seen):
            self.forget_fleet(seen.key)
        self.records.update_fleet(seen, self.now())

    def forget_fleet(self, key: FleetKey) -> None:
        """A RolloutFleet is gone, and its pod members with it."""
        if self.records.fleets.pop(key, None) is not None:
            self.metrics.forget_fleet(*key)
        for member in self.records.pod_members(*key):
            self.forget(member)

    def sync_monitor(
        self, *, restore: Mapping[TargetKey, Mapping[str, Any]] | None = None, reset: Iterable[TargetKey] = ()
    ) -> None:
        """Give the monitor the current target list; new targets resume from their persisted status."""
        reset = set(reset)
        if reset:  # a new endpoint or model is a new server: forget what the old one earned
            self.monitor.set_targets([t for key, t in self.monitor.targets.items() if key not in reset])
        initial = self.records.restored_states(restore or {}, skip=set(self.monitor.states) | reset)
        self.monitor.set_targets(self.records.probe_targets(), initial_states=initial)

    async def change_weights(
        self, key: TargetKey, change: Callable[[HealthState], Transition | None]
    ) -> Transition | None:
        """Apply ``change`` to a probed target's state (instance identity, refits, staleness); None if not probed.

        The transition itself is reported in the monitor's next round, like a drain; the fleets (weights versions,
        staleShards) and the writer learn of the change now."""
        if key not in self.monitor.states:
            return None
        transition = await self.monitor.change_state(key, change)
        self.dirty(key.namespace)
        self.wake.set()
        return transition
