"""Refit application: the trainers' PolicyVersions turned into their shards' health.

:mod:`fleet_operator.weights` decides (pure): which refits of a PolicyVersion are new, which are a replay, which
shards lag the policy version. :class:`RefitApplication` keeps what it saw and applied, and applies the decisions to
the shards' health states through :class:`~fleet_operator.targets.Targets`: Refitting (no traffic while the update
runs), Succeeded (the shard holds the version), Failed and lagging (Stale until a refit succeeds).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from fleet_operator.decisions import GENERATION_SHARD
from fleet_operator.records import FleetKey, TargetKey
from fleet_operator.targets import Targets
from fleet_operator.weights import PolicyObservation, lagging, observe_policy, refit_targets, refits_to_apply
from rollout_runtime.health import HealthState, Transition
from rollout_runtime.kube.api import RefitRecord

__all__ = ["RefitApplication"]

log = logging.getLogger(__name__)


class RefitApplication:
    """The PolicyVersions seen, by fleet, and the refits applied, by shard (see the module docstring)."""

    def __init__(self, targets: Targets) -> None:
        self._targets = targets
        self._policies: dict[FleetKey, PolicyObservation] = {}
        """The trainers' PolicyVersions, by fleet (see :mod:`fleet_operator.weights`)."""
        self._applied: dict[TargetKey, RefitRecord] = {}

    def policy_version(self, namespace: str, fleet: str) -> int | None:
        """The trainer's policy version for a fleet (None: no valid PolicyVersion)."""
        seen = self._policies.get(FleetKey(namespace, fleet))
        return seen.spec.policy_version if seen is not None and seen.spec is not None else None

    async def upsert(self, body: Mapping[str, Any]) -> None:
        """A fleet's PolicyVersion was listed, added or modified: apply its new refits, then mark shards that lag
        the policy version by more than the fleet's ``maxWeightsLag`` Stale (once every object is listed)."""
        seen = observe_policy(body)
        known = self._policies.get(seen.key)
        if seen.invalid is not None:
            log.error("PolicyVersion %s/%s ignored: %s", *seen.key, seen.invalid)
        first = known is None or known.uid != seen.uid
        self._policies[seen.key] = seen
        if self._targets.synced.is_set():
            await self._apply(seen.key, first_sighting=first)
        self._fleet_changed(seen.key)

    def forget(self, namespace: str, name: str) -> None:
        """A fleet's PolicyVersion was deleted: the fleet publishes no policy version (every answer commits)."""
        if self._policies.pop(FleetKey(namespace, name), None) is not None:
            self._fleet_changed(FleetKey(namespace, name))

    async def apply_seen(self) -> None:
        """Apply the PolicyVersions seen while priming: their shards are known now."""
        for key in list(self._policies):
            await self._apply(key, first_sighting=True)

    async def record_refit(self, key: TargetKey, version: int, identity: str | None = None) -> Transition | None:
        """A refit of the target's instance ``identity`` to policy ``version`` succeeded (the trainer's word)."""
        return await self._targets.change_weights(key, lambda state: state.refit_succeeded(version, identity=identity))

    def _fleet_changed(self, key: FleetKey) -> None:
        fleet = self._targets.records.fleets.get(key)
        if fleet is not None:
            fleet.dirty_since = fleet.dirty_since or self._targets.now()
        self._targets.wake.set()

    async def _apply(self, key: FleetKey, *, first_sighting: bool) -> None:
        seen = self._policies.get(key)
        if seen is None or seen.spec is None:
            return
        targets, namespace = self._targets, key.namespace
        by_target = {
            k.name: state
            for k, state in targets.monitor.states.items()
            if k.kind == GENERATION_SHARD and k.namespace == namespace
        }
        named = refit_targets(key.name, by_target)  # a pod member is refit under its pod's name
        shards = {name: TargetKey(GENERATION_SHARD, namespace, target) for name, target in named.items()}
        states = {name: by_target[target] for name, target in named.items()}
        applied = {name: self._applied[k] for name, k in shards.items() if k in self._applied}
        apply, baseline = refits_to_apply(seen.spec.refits, applied, states, first_sighting=first_sighting)
        for refit in baseline:
            self._applied[shards[refit.shard]] = refit
            log.info("PolicyVersion %s/%s: refit of Stale shard %s taken as already applied", *key, refit.shard)
        for refit in apply:
            shard = shards[refit.shard]
            self._applied[shard] = refit
            if refit.phase == "Succeeded":
                await self.record_refit(shard, refit.version, refit.instance)
            elif refit.phase == "Refitting":
                await targets.change_weights(shard, HealthState.begin_refit)
            else:
                message = f"reported by the trainer (version {refit.version})"
                await targets.change_weights(shard, functools.partial(HealthState.refit_failed, message=message))
        fleet = targets.records.fleets.get(key)
        if fleet is None or fleet.spec is None:
            return
        members = targets.records.members(namespace, targets.monitor.states, targets.monitor.last_ok_at)
        policy = seen.spec.policy_version
        message = f"weights lag policy version {policy} by more than maxWeightsLag {fleet.spec.policy.max_weights_lag}"
        for name in lagging(fleet.spec, members, policy, fleet.name):
            target = TargetKey(GENERATION_SHARD, namespace, name)
            await targets.change_weights(target, lambda state: state.mark_stale(message))
