"""The reconciliation engine: a thin shell that owns the operator's parts and takes the watches' events.

Each kind's kopf handler (:mod:`fleet_operator.handlers`) calls the matching method here: ``upsert_target`` /
``delete_target`` (GenerationShards and EnvironmentServers), ``upsert_fleet`` / ``delete_fleet``, ``upsert_pod`` /
``delete_pod`` and ``upsert_endpoint_slice`` / ``delete_endpoint_slice``, ``upsert_policy_version`` /
``delete_policy_version``. The parts, each readable on its own:

- :class:`~fleet_operator.targets.Targets`: the records and the runtime's HealthMonitor that probes them (the one
  probe + hysteresis implementation), the state every other part changes through it;
- :class:`~fleet_operator.membership.PodMembership`: pods and EndpointSlices, and the pod members a fleet's
  ``shardPods``/``environmentServerPods`` make of them (probed and published, never written to);
- :class:`~fleet_operator.refits.RefitApplication`: the trainers' PolicyVersions applied to their shards' health;
- :class:`~fleet_operator.writer.StatusWriter`: target and fleet statuses and Events, coalesced.

Two tasks run while the operator leads: the probe loop (``HealthMonitor.rounds()`` into the writer's
:meth:`~fleet_operator.writer.StatusWriter.observe_round`) and the writer's loop.

Nothing is written at startup for objects whose persisted status is already right: a target resumes from its
persisted phase and counts (``HealthState.restore``), so a restarted or failed-over operator neither empties a
fleet's healthy set nor rewrites every status.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, cast

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from fleet_operator.decisions import ENVIRONMENT_SERVER, GENERATION_SHARD, ROLLOUT_FLEET
from fleet_operator.kube import KubeApi
from fleet_operator.membership import PodMembership
from fleet_operator.metrics import FleetMetrics
from fleet_operator.records import FleetKey, TargetKey, observe_fleet, observe_target
from fleet_operator.refits import RefitApplication
from fleet_operator.schedule import WriteSchedule, retry_delay
from fleet_operator.settings import OperatorSettings
from fleet_operator.targets import Targets
from fleet_operator.writer import PLURALS, StatusWriter
from rollout_runtime.health import HealthMonitor, HealthPhase, Prober, ProbeRound, Transition
from rollout_runtime.kube import kinds
from rollout_runtime.kube.errors import api_error_is_transient

__all__ = ["PLURALS", "ROLLOUT_FLEET", "FleetEngine", "TargetKey"]

log = logging.getLogger(__name__)

TARGET_KINDS = (GENERATION_SHARD, ENVIRONMENT_SERVER)
"""The kinds that are probe targets of their own (``upsert_target``/``delete_target``)."""


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
        monitor: HealthMonitor[TargetKey] = HealthMonitor([], prober, max_concurrency=settings.probe_concurrency)
        self._targets = Targets(monitor, metrics if metrics is not None else FleetMetrics())
        self._probe_policy = settings.probe_policy()
        self._members = PodMembership(self._targets, self._probe_policy)
        self._refits = RefitApplication(self._targets)
        schedule = WriteSchedule(
            heartbeat_seconds=settings.status_heartbeat_seconds,
            coalesce_seconds=settings.fleet_coalesce_seconds,
            retry_seconds=settings.write_retry_seconds,
        )
        self._writer = StatusWriter(
            self._targets, api, schedule, policy_version=self._refits.policy_version, wall_clock=wall_clock
        )

    @property
    def metrics(self) -> FleetMetrics:
        return self._targets.metrics

    @property
    def synced(self) -> bool:
        return self._targets.synced.is_set()

    @property
    def writes(self) -> dict[str, int]:
        """Status writes made, by kind (also exported as fleet_status_writes_total)."""
        return self._writer.writes

    @property
    def instance_changes(self) -> int:
        """Instance identity changes seen on known pod members (restarts, replaced pods)."""
        return self._members.instance_changes

    # ------------------------------------------------------------------------------------------------------------
    # Inputs, one pair per kind (called by its kopf handler, and by :meth:`prime`). Listed, added or modified objects
    # are upserts (our own status writes included: cheap when nothing changed); kopf re-lists after 410 Gone.

    async def upsert_target(self, kind: str, body: Mapping[str, Any]) -> None:
        """A GenerationShard or EnvironmentServer (``kind``) was listed, added or modified."""
        await self._targets.apply(observe_target(kind, body, self._settings.cluster_domain, self._probe_policy))
        self._targets.wake.set()

    async def delete_target(self, kind: str, namespace: str, name: str) -> None:
        """A GenerationShard or EnvironmentServer was deleted."""
        self._targets.forget(TargetKey(kind, namespace, name))
        self._targets.wake.set()

    async def upsert_fleet(self, body: Mapping[str, Any]) -> None:
        """A RolloutFleet was listed, added or modified: its record, then its pod members."""
        seen = observe_fleet(body)
        self._targets.update_fleet(seen)
        await self._members.sync(seen.key.namespace, fleet=seen.key.name)
        self._targets.wake.set()

    async def delete_fleet(self, namespace: str, name: str) -> None:
        """A RolloutFleet was deleted: its pod members go with it."""
        self._targets.forget_fleet(FleetKey(namespace, name))
        self._targets.wake.set()

    async def upsert_pod(self, body: Mapping[str, Any]) -> None:
        await self._members.upsert_pod(body)

    async def delete_pod(self, namespace: str, name: str) -> None:
        """A pod was deleted: the members it was go with it."""
        await self._members.delete_pod(namespace, name)

    async def upsert_endpoint_slice(self, body: Mapping[str, Any]) -> None:
        await self._members.upsert_endpoint_slice(body)

    async def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        """An EndpointSlice was deleted: the members it listed go with it (unless another slice lists them)."""
        await self._members.delete_endpoint_slice(namespace, name)

    async def upsert_policy_version(self, body: Mapping[str, Any]) -> None:
        """A fleet's PolicyVersion was listed, added or modified (see :class:`RefitApplication`)."""
        await self._refits.upsert(body)

    async def delete_policy_version(self, namespace: str, name: str) -> None:
        """A fleet's PolicyVersion was deleted: the fleet publishes no policy version (every answer commits)."""
        self._refits.forget(namespace, name)

    async def prime(self) -> None:
        """List every object once before any fleet status is written.

        kopf lists the three kinds independently; without this, a fleet listed before its shards would publish
        an empty healthy set for a moment after every restart. Fleets are written only once primed.
        """
        targets = self._targets
        namespaces: list[str | None] = list(self._settings.namespaces) or [None]
        listed: list[tuple[str, Callable[[Mapping[str, Any]], Awaitable[None]]]] = []
        if self._settings.pod_discovery:  # pods first: a fleet listed later finds its pod members at once
            listed += [(kinds.POD.plural, self.upsert_pod), (kinds.ENDPOINT_SLICE.plural, self.upsert_endpoint_slice)]
        listed += [(PLURALS[kind], functools.partial(self.upsert_target, kind)) for kind in TARGET_KINDS]
        listed.append((PLURALS[ROLLOUT_FLEET], self.upsert_fleet))
        targets.priming = {}
        try:
            for plural, upsert in listed:
                for namespace in namespaces:
                    for body in await self._list_with_retry(plural, namespace):
                        await upsert(body)
        finally:
            primed, targets.priming = targets.priming, None
        # One probe-list sync for everything listed: one per object would be quadratic in the fleet size.
        targets.sync_monitor(restore=primed)
        for key in primed:
            target = targets.records.targets.get(key)
            if target is not None and target.spec is not None and target.spec.drain:
                await targets.monitor.set_draining(key, True)
        targets.synced.set()
        await self._refits.apply_seen()
        targets.wake.set()

    async def _list_with_retry(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        """List, retrying transient failures (429 while a new CRD's storage initialises, 5xx, lost connections)."""
        delay = self._settings.write_retry_seconds
        while True:
            try:
                return await self._api.list_objects(plural, namespace)
            except (ApiException, OSError, TimeoutError, aiohttp.ClientError) as exc:
                if not api_error_is_transient(exc):
                    raise  # 401/403/404: configuration or RBAC, not weather; fail loudly
                status = getattr(exc, "status", None)
                log.warning("listing %s failed (%s); retrying in %.1f s", plural, status or type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = retry_delay(delay, self._settings.write_retry_seconds)

    # ------------------------------------------------------------------------------------------------------------
    # Health and weights evidence from outside the probes

    def phase(self, kind: str, namespace: str, name: str) -> HealthPhase | None:
        """A target's current phase (None: unknown or never probed)."""
        state = self._targets.monitor.states.get(TargetKey(kind, namespace, name))
        return state.phase if state is not None else None

    async def observe_instance(self, kind: str, namespace: str, name: str, identity: str | None) -> Transition | None:
        """Feed a target's instance identity (e.g. a pod's ``"<uid>:<restartCount>"`` from discovery) to its state
        (:meth:`HealthState.observe_instance`). A refit shard whose identity changed becomes Stale: out of its
        fleets' healthy sets, counted in ``staleShards``."""
        key = TargetKey(kind, namespace, name)
        return await self._targets.change_weights(key, lambda state: state.observe_instance(identity))

    async def record_refit(
        self, kind: str, namespace: str, name: str, version: int, identity: str | None = None
    ) -> Transition | None:
        """A refit of the target's instance ``identity`` to policy ``version`` succeeded (the trainer's word)."""
        return await self._refits.record_refit(TargetKey(kind, namespace, name), version, identity)

    def policy_version(self, namespace: str, fleet: str) -> int | None:
        """The trainer's policy version for a fleet (None: no valid PolicyVersion)."""
        return self._refits.policy_version(namespace, fleet)

    # ------------------------------------------------------------------------------------------------------------
    # The loops

    async def run(self) -> None:
        """Probe and write until cancelled (the operator's leadership term)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._probe_loop(), name="fleet-probe-loop")
            tasks.create_task(self._writer.run(self._settings.write_retry_seconds), name="fleet-write-loop")

    async def _probe_loop(self) -> None:
        async with contextlib.aclosing(
            cast(AsyncGenerator[ProbeRound[TargetKey], None], self._targets.monitor.rounds())
        ) as rounds:
            async for probe_round in rounds:
                self._writer.observe_round(probe_round)

    async def probe_now(self) -> ProbeRound[TargetKey]:
        """Probe every target once, outside the schedule (tests, and ``rollout-fleet status --probe``)."""
        probe_round = await self._targets.monitor.probe_round()
        self._writer.observe_round(probe_round)
        return probe_round

    async def write_pass(self, now: float) -> float:
        """One writer pass at loop time ``now`` (:meth:`StatusWriter.write_pass`); when the next one is due."""
        return await self._writer.write_pass(now)
