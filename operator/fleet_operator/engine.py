"""The reconciliation engine, the I/O around pure parts: it probes every target through the shared HealthMonitor
and writes statuses, coalesced.

Fed by the kopf handlers (:meth:`FleetEngine.upsert`, :meth:`FleetEngine.forget`), it keeps the records of
:mod:`fleet_operator.records` (one per GenerationShard, EnvironmentServer and RolloutFleet) and syncs the monitor's
probe list with them. Two tasks run while the operator leads:

- the probe loop drives ``HealthMonitor.rounds()`` (the runtime's one probe + hysteresis implementation) and turns
  results into metrics and transitions into Events and dirty marks;
- pod members (:mod:`fleet_operator.discovery`): the Pods and EndpointSlices the handlers pass in are kept in
  tables; a fleet's ``shardPods``/``environmentServerPods`` turn them into targets like GenerationShards (records
  with ``fleet`` set: probed and published, never written to). Every change of a member's instance identity goes
  through :meth:`FleetEngine._observe_instance` (a refit member becomes Stale);
- the writer follows :mod:`fleet_operator.schedule` (when, in what order, retries) and
  :mod:`fleet_operator.decisions` (what the statuses say, whether they need a write): target statuses at once on a
  phase change and otherwise on a heartbeat; fleet statuses ``fleet_coalesce_seconds`` after the first change (a
  burst of shard transitions is one write) and on a heartbeat. Failed writes are retried with backoff; a 404 means
  the object is gone and its record is dropped (which also covers deletions missed while a watch was down).

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
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

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
from fleet_operator.discovery import (
    PodView,
    SliceView,
    member_spec,
    observe_endpoint_slice,
    observe_pod,
    pod_member,
    selections,
    slice_members,
    target_name,
)
from fleet_operator.kube import KubeApi, StatusWriteError, WriteOutcome
from fleet_operator.metrics import FleetMetrics
from fleet_operator.records import (
    FleetKey,
    FleetRecord,
    Record,
    Records,
    TargetKey,
    TargetObservation,
    TargetRecord,
    expected_model,
    observe_fleet,
    observe_member,
    observe_target,
    parse_status,
)
from fleet_operator.schedule import MAX_IN_FLIGHT_WRITES, PASS_ORDER, Sweep, TargetWrite, WriteSchedule, retry_delay
from fleet_operator.settings import OperatorSettings
from fleet_operator.weights import PolicyObservation, lagging, observe_policy, refits_to_apply
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
from rollout_runtime.kube import kinds
from rollout_runtime.kube.api import RefitRecord, RolloutFleetStatus, ShardStatus
from rollout_runtime.kube.errors import api_error_is_transient

__all__ = ["PLURALS", "ROLLOUT_FLEET", "FleetEngine", "TargetKey"]

log = logging.getLogger(__name__)

PLURALS: Final[Mapping[str, str]] = {kind: names.plural for kind, names in kinds.BY_KIND.items()}
POD: Final[str] = kinds.POD.kind
ENDPOINT_SLICE: Final[str] = kinds.ENDPOINT_SLICE.kind
_MAX_PENDING_EVENTS: Final[int] = 1000


@dataclass(frozen=True)
class _Event:
    ref: Record
    note: EventNote


def _persisted_member(
    written: Mapping[str, Any] | None, kind: str, name: str, instance: str
) -> Mapping[str, Any] | None:
    """A pod member's health as its fleet's persisted status shows it: in the healthy set with the same instance
    means it was Healthy (a restarted operator resumes it there instead of emptying the set); otherwise nothing."""
    key = "shards" if kind == GENERATION_SHARD else "environmentServers"
    for entry in (written or {}).get(key) or []:
        if isinstance(entry, dict) and entry.get("name") == name and entry.get("instance") == instance:
            return {"phase": HealthPhase.HEALTHY.value}
    return None


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
        self._policy = settings.probe_policy()
        self._api = api
        self._metrics = metrics if metrics is not None else FleetMetrics()
        self._wall = wall_clock
        self._schedule = WriteSchedule(
            heartbeat_seconds=settings.status_heartbeat_seconds,
            coalesce_seconds=settings.fleet_coalesce_seconds,
            retry_seconds=settings.write_retry_seconds,
        )
        self._monitor: HealthMonitor[TargetKey] = HealthMonitor([], prober, max_concurrency=settings.probe_concurrency)
        self._records = Records()
        self._events: deque[_Event] = deque(maxlen=_MAX_PENDING_EVENTS)
        self._wake = asyncio.Event()
        self._synced = asyncio.Event()
        self._priming: dict[TargetKey, Mapping[str, Any]] | None = None
        """While priming: new targets' persisted statuses, synced into the monitor once at the end."""
        self._pods: dict[str, dict[str, PodView]] = {}
        """namespace -> pod name -> what its latest watch event said."""
        self._slices: dict[str, dict[str, SliceView]] = {}
        """namespace -> EndpointSlice name -> what its latest watch event said."""
        self.instance_changes = 0
        """Instance identity changes seen on known pod members (restarts, replaced pods)."""
        self._policies: dict[FleetKey, PolicyObservation] = {}
        """The trainers' PolicyVersions, by fleet (see :mod:`fleet_operator.weights`)."""
        self._refits_applied: dict[TargetKey, RefitRecord] = {}
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
        listed = [(kinds.POD.plural, POD), (kinds.ENDPOINT_SLICE.plural, ENDPOINT_SLICE)]
        if not self._settings.pod_discovery:
            listed = []
        listed += [(PLURALS[kind], kind) for kind in (GENERATION_SHARD, ENVIRONMENT_SERVER, ROLLOUT_FLEET)]
        try:
            for plural, kind in listed:  # pods first: a fleet listed later finds its pod members at once
                for namespace in namespaces:
                    for body in await self._list_with_retry(plural, namespace):
                        await self.upsert(kind, body)
        finally:
            primed, self._priming = self._priming, None
        # One probe-list sync for everything listed: one per object would be quadratic in the fleet size.
        self._sync_monitor(restore=primed)
        for key in primed:
            target = self._records.targets.get(key)
            if target is not None and target.spec is not None and target.spec.drain:
                await self._monitor.set_draining(key, True)
        self._synced.set()
        for fleet_key in list(self._policies):  # PolicyVersions seen while priming: their shards are known now
            await self._apply_policy(fleet_key, first_sighting=True)
        self._wake.set()

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

    async def upsert(self, kind: str, body: Mapping[str, Any]) -> None:
        """An object was listed, added or modified (our own status writes included: cheap when nothing changed)."""
        if kind == ROLLOUT_FLEET:
            self._upsert_fleet(body)
            meta = body.get("metadata") or {}
            await self._sync_pod_members(str(meta.get("namespace", "")), fleet=str(meta.get("name", "")))
        elif kind == POD:
            await self._upsert_pod(body)
        elif kind == ENDPOINT_SLICE:
            await self._upsert_slice(body)
        else:
            await self._upsert_target(kind, body)
        self._wake.set()

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """An object was deleted."""
        if kind == ROLLOUT_FLEET:
            if self._records.fleets.pop(FleetKey(namespace, name), None) is not None:
                self._metrics.forget_fleet(namespace, name)
            for key in self._records.pod_members(namespace, name):
                self.forget(*key)
            return
        target = self._records.targets.pop(TargetKey(kind, namespace, name), None)
        if target is None:
            return
        self._sync_monitor()
        self._metrics.forget_target(namespace, kind, name)
        self._records.dirty_fleets(namespace, asyncio.get_running_loop().time())
        self._wake.set()

    async def _upsert_target(self, kind: str, body: Mapping[str, Any]) -> None:
        await self._apply_target(observe_target(kind, body, self._settings.cluster_domain, self._policy))

    async def _apply_target(self, seen: TargetObservation) -> None:
        key = seen.key
        if self._records.replaced(seen):
            self.forget(*key)
        update = self._records.update_target(seen, asyncio.get_running_loop().time())
        if update.probe_changed and self._priming is not None:
            self._priming[key] = seen.status
        elif update.probe_changed:
            relocated = update.previous_spec is not None and (
                seen.endpoint != self._monitor.targets.get(key, ProbeTarget("", "")).endpoint
                or expected_model(update.previous_spec) != expected_model(seen.spec)
            )
            self._sync_monitor(restore={key: seen.status}, reset={key} if relocated else set())
        if seen.spec is not None and key in self._monitor.states:
            # The monitor reports the resulting transition in its next round, like any other.
            await self._monitor.set_draining(key, seen.spec.drain)
        if update.probe_changed or update.labels_changed:
            self._records.dirty_fleets(key.namespace, asyncio.get_running_loop().time())

    # ------------------------------------------------------------------------------------------------------------
    # Pod members

    async def _upsert_pod(self, body: Mapping[str, Any]) -> None:
        pod = observe_pod(body)
        self._pods.setdefault(pod.namespace, {})[pod.name] = pod
        await self._sync_pod_members(pod.namespace, pod=pod.name)

    async def _upsert_slice(self, body: Mapping[str, Any]) -> None:
        view = observe_endpoint_slice(body)
        previous = self._slices.setdefault(view.namespace, {}).get(view.name)
        self._slices[view.namespace][view.name] = view
        services = {name for name in (view.service, previous.service if previous else None) if name is not None}
        await self._sync_pod_members(view.namespace, services=services)

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        """An object was deleted (a pod or EndpointSlice takes its members with it)."""
        if kind == POD:
            self._pods.get(namespace, {}).pop(name, None)
            await self._sync_pod_members(namespace, pod=name)
        elif kind == ENDPOINT_SLICE:
            gone = self._slices.get(namespace, {}).pop(name, None)
            services = {gone.service} if gone is not None and gone.service is not None else set()
            await self._sync_pod_members(namespace, services=services)
        else:
            self.forget(kind, namespace, name)
        self._wake.set()

    async def _sync_pod_members(
        self,
        namespace: str,
        *,
        fleet: str | None = None,
        pod: str | None = None,
        services: set[str] | None = None,
    ) -> None:
        """Bring the pod members of the fleets in ``namespace`` up to date with the pod and slice tables.

        Scope: one ``fleet`` (its spec changed: everything of it is recomputed), one ``pod`` (label selections
        look at that pod only; Service selections are recomputed, since a pod's identity and readiness feed them),
        or the fleets following one of ``services`` (a slice changed).
        """
        pods = self._pods.get(namespace, {})
        slices = list(self._slices.get(namespace, {}).values())
        full = pod is None and services is None
        for record in list(self._records.fleets.values()):
            if record.namespace != namespace or (fleet is not None and record.name != fleet):
                continue
            chosen = selections(record.spec) if record.spec is not None else []
            by_pod = pod is not None and all(selection.service is None for _, selection in chosen)
            # One pod's event under label selections looks at that pod only (no scan of the fleet's members).
            known = {} if by_pod else self._records.pod_members(namespace, record.name)
            decided: set[TargetKey] = set()
            """The keys this pass decides about: members outside its scope are left as they are."""
            if full:
                decided = {key for key in known if key.kind not in {kind for kind, _ in chosen}}
            wanted: set[TargetKey] = set()
            for kind, selection in chosen:
                of_kind = {key for key in known if key.kind == kind}
                if selection.service is not None:
                    if pod is None and services is not None and selection.service not in services:
                        continue
                    members = slice_members(selection, slices, pods)
                    decided |= of_kind
                elif services is not None:
                    continue
                elif pod is not None:
                    view = pods.get(pod)
                    found = pod_member(selection, view) if view is not None else None
                    members = [found] if found is not None else []
                    decided.add(TargetKey(kind, namespace, target_name(record.name, pod)))
                else:
                    members = [m for view in pods.values() if (m := pod_member(selection, view)) is not None]
                    decided |= of_kind
                for member in members:
                    seen = observe_member(
                        kind,
                        namespace,
                        record.name,
                        member,
                        member_spec(selection, member),
                        self._policy,
                        status=_persisted_member(record.write.written, kind, member.name, member.instance),
                    )
                    wanted.add(seen.key)
                    before = self._records.targets.get(seen.key)
                    if seen.invalid is not None and (before is None or before.invalid != seen.invalid):
                        log.warning("fleet %s/%s: not probing %s", namespace, record.name, seen.invalid)
                    await self._apply_target(seen)
                    await self._observe_instance(seen.key, member.instance)
            for key in decided - wanted:
                if key in self._records.targets:
                    self.forget(*key)

    async def _observe_instance(self, key: TargetKey, instance: str | None) -> None:
        """THE one place a pod member's instance identity is recorded, and where a change of it is acted on.

        ``instance`` is ``<pod uid>:<total container restarts>``: a change means the server behind the member
        restarted in place or was replaced, so it holds base weights and what its probes earned says nothing of the
        new one. The identity goes to the member's health state (:meth:`observe_instance`): a member that was refit
        becomes Stale until the trainer refits it again. A member that was never refit (weights not tracked) starts
        over instead (Pending: it must pass ``successThreshold`` probes again before it takes traffic).
        """
        target = self._records.targets.get(key)
        if target is None or target.instance == instance:
            return
        previous, target.instance = target.instance, instance
        await self.observe_instance(*key, instance)  # also records the first identity seen
        if previous is None:
            return  # the first identity seen: nothing to compare with
        self.instance_changes += 1
        log.info("%s %s/%s: new instance %s (was %s)", *key, instance, previous)
        state = self._monitor.states.get(key)
        stale = state is not None and (state.stale or state.refitting)
        if not stale and target.spec is not None and key in self._monitor.states and self._priming is None:
            self._sync_monitor(reset={key})
            await self.observe_instance(*key, instance)  # the fresh state knows the new instance
            if target.spec.drain:
                await self._monitor.set_draining(key, True)
        self._records.dirty_fleets(key.namespace, asyncio.get_running_loop().time())

    def _upsert_fleet(self, body: Mapping[str, Any]) -> None:
        seen = observe_fleet(body)
        if self._records.replaced(seen):
            self.forget(ROLLOUT_FLEET, *seen.key)
        self._records.update_fleet(seen, asyncio.get_running_loop().time())

    def _sync_monitor(
        self, *, restore: Mapping[TargetKey, Mapping[str, Any]] | None = None, reset: Iterable[TargetKey] = ()
    ) -> None:
        """Give the monitor the current target list; new targets resume from their persisted status."""
        reset = set(reset)
        if reset:  # a new endpoint or model is a new server: forget what the old one earned
            self._monitor.set_targets([t for key, t in self._monitor.targets.items() if key not in reset])
        initial = self._records.restored_states(restore or {}, skip=set(self._monitor.states) | reset)
        self._monitor.set_targets(self._records.probe_targets(), initial_states=initial)

    # ------------------------------------------------------------------------------------------------------------
    # The loops

    async def run(self) -> None:
        """Probe and write until cancelled (the operator's leadership term)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._probe_loop(), name="fleet-probe-loop")
            tasks.create_task(self._write_loop(), name="fleet-write-loop")

    async def _probe_loop(self) -> None:
        async with contextlib.aclosing(
            cast(AsyncGenerator[ProbeRound[TargetKey], None], self._monitor.rounds())
        ) as rounds:
            async for probe_round in rounds:
                self._on_round(probe_round)

    async def probe_now(self) -> ProbeRound[TargetKey]:
        """Probe every target once, outside the schedule (tests, and ``rollout-fleet status --probe``)."""
        probe_round = await self._monitor.probe_round()
        self._on_round(probe_round)
        return probe_round

    def phase(self, kind: str, namespace: str, name: str) -> HealthPhase | None:
        """A target's current phase (None: unknown or never probed)."""
        state = self._monitor.states.get(TargetKey(kind, namespace, name))
        return state.phase if state is not None else None

    async def observe_instance(self, kind: str, namespace: str, name: str, identity: str | None) -> Transition | None:
        """Feed a target's instance identity (e.g. a pod's ``"<uid>:<restartCount>"`` from discovery) to its state:
        the operator's one entry point for restart evidence (:meth:`HealthState.observe_instance`). A refit shard
        whose identity changed becomes Stale: out of its fleets' healthy sets, counted in ``staleShards``."""
        key = TargetKey(kind, namespace, name)
        if key not in self._monitor.states:
            return None
        transition = await self._monitor.change_state(key, lambda state: state.observe_instance(identity))
        self._weights_changed(key)
        return transition

    async def record_refit(
        self, kind: str, namespace: str, name: str, version: int, identity: str | None = None
    ) -> Transition | None:
        """A refit of the target's instance ``identity`` to policy ``version`` succeeded (the trainer's word)."""
        key = TargetKey(kind, namespace, name)
        if key not in self._monitor.states:
            return None
        transition = await self._monitor.change_state(
            key, lambda state: state.refit_succeeded(version, identity=identity)
        )
        self._weights_changed(key)
        return transition

    async def upsert_policy_version(self, body: Mapping[str, Any]) -> None:
        """A fleet's PolicyVersion was listed, added or modified: apply its new refits, then mark shards that lag
        the policy version by more than the fleet's ``maxWeightsLag`` Stale (:mod:`fleet_operator.weights`)."""
        seen = observe_policy(body)
        known = self._policies.get(seen.key)
        if seen.invalid is not None:
            log.error("PolicyVersion %s/%s ignored: %s", *seen.key, seen.invalid)
        first = known is None or known.uid != seen.uid
        self._policies[seen.key] = seen
        if self._synced.is_set():
            await self._apply_policy(seen.key, first_sighting=first)
        fleet = self._records.fleets.get(seen.key)
        if fleet is not None:
            fleet.dirty_since = fleet.dirty_since or asyncio.get_running_loop().time()
        self._wake.set()

    def forget_policy_version(self, namespace: str, name: str) -> None:
        """A fleet's PolicyVersion was deleted: the fleet publishes no policy version (every answer commits)."""
        if self._policies.pop(FleetKey(namespace, name), None) is None:
            return
        fleet = self._records.fleets.get(FleetKey(namespace, name))
        if fleet is not None:
            fleet.dirty_since = fleet.dirty_since or asyncio.get_running_loop().time()
        self._wake.set()

    def policy_version(self, namespace: str, fleet: str) -> int | None:
        """The trainer's policy version for a fleet (None: no valid PolicyVersion)."""
        seen = self._policies.get(FleetKey(namespace, fleet))
        return seen.spec.policy_version if seen is not None and seen.spec is not None else None

    async def _apply_policy(self, key: FleetKey, *, first_sighting: bool) -> None:
        seen = self._policies.get(key)
        if seen is None or seen.spec is None:
            return
        namespace = key.namespace
        states = {
            k.name: state
            for k, state in self._monitor.states.items()
            if k.kind == GENERATION_SHARD and k.namespace == namespace
        }
        applied = {k.name: r for k, r in self._refits_applied.items() if k.namespace == namespace}
        apply, baseline = refits_to_apply(seen.spec.refits, applied, states, first_sighting=first_sighting)
        for refit in baseline:
            self._refits_applied[TargetKey(GENERATION_SHARD, namespace, refit.shard)] = refit
            log.info("PolicyVersion %s/%s: refit of Stale shard %s taken as already applied", *key, refit.shard)
        for refit in apply:
            shard = TargetKey(GENERATION_SHARD, namespace, refit.shard)
            self._refits_applied[shard] = refit
            if refit.phase == "Succeeded":
                await self.record_refit(*shard, refit.version, refit.instance)
                continue
            if refit.phase == "Refitting":
                await self._monitor.change_state(shard, HealthState.begin_refit)
            else:
                await self._monitor.change_state(
                    shard,
                    functools.partial(
                        HealthState.refit_failed, message=f"reported by the trainer (version {refit.version})"
                    ),
                )
            self._weights_changed(shard)
        fleet = self._records.fleets.get(key)
        if fleet is None or fleet.spec is None:
            return
        members = self._records.members(namespace, self._monitor.states, self._monitor.last_ok_at)
        policy = seen.spec.policy_version
        message = f"weights lag policy version {policy} by more than maxWeightsLag {fleet.spec.policy.max_weights_lag}"
        for name in lagging(fleet.spec, members, policy, fleet.name):
            target = TargetKey(GENERATION_SHARD, namespace, name)
            await self._monitor.change_state(target, lambda state: state.mark_stale(message))
            self._weights_changed(target)

    def _weights_changed(self, key: TargetKey) -> None:
        """The transition itself is reported in the monitor's next round, like a drain; the fleets (weights
        versions, staleShards) and the writer learn of the change now."""
        self._records.dirty_fleets(key.namespace, asyncio.get_running_loop().time())
        self._wake.set()

    def _on_round(self, probe_round: ProbeRound[TargetKey]) -> None:
        for key, result in probe_round.results.items():
            self._metrics.probe_duration_seconds.labels(key.kind).observe(result.latency_seconds)
            if not result.ok:
                self._metrics.probe_failures_total.labels(key.kind, result.reason.value).inc()
        for key, transition in probe_round.transitions:
            if key in self._records.targets:
                self._on_transition(key, transition)
        if probe_round.transitions:
            self._wake.set()

    def _on_transition(self, key: TargetKey, transition: Transition) -> None:
        target = self._records.targets[key]
        self._metrics.health_transitions_total.labels(
            key.kind, transition.from_phase.value, transition.to_phase.value
        ).inc()
        self._metrics.shard_healthy.labels(key.namespace, key.kind, key.name).set(
            1 if transition.to_phase.serving else 0
        )
        note = transition_event(transition)
        if not target.derived:  # a pod member has no object of its own: its fleet's conditions name it
            self._events.append(_Event(ref=target, note=note))
        self._records.dirty_fleets(key.namespace, asyncio.get_running_loop().time())
        log.info("%s %s/%s: %s", *key, note.message)

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
        """One writer pass at loop time ``now``, in :data:`~fleet_operator.schedule.PASS_ORDER`: transitions, then
        fleets (once primed), then heartbeats; then Events.

        Each target sweep keeps up to ``MAX_IN_FLIGHT_WRITES`` PATCHes in flight.

        Returns the loop time by which the next pass is due (a heartbeat, a coalescing window, a retry).
        """
        next_due = now + self._schedule.heartbeat_seconds
        for sweep in PASS_ORDER:
            if sweep is Sweep.FLEETS:
                if self._synced.is_set():
                    for fleet in list(self._records.fleets.values()):
                        next_due = min(next_due, await self._maybe_write_fleet(fleet, now))
                continue
            writes: list[tuple[TargetRecord, dict[str, Any]]] = []
            checked: list[tuple[TargetKey, TargetRecord]] = []
            for key, target in list(self._records.targets.items()):
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
                    if key in self._records.targets:
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
        state = self._monitor.states.get(key)
        if state is None:
            return None
        self._metrics.shard_healthy.labels(target.namespace, target.kind, target.name).set(1 if state.serving else 0)
        status = shard_status(
            state,
            endpoint=target.endpoint,
            generation=target.generation,
            last_success_at=self._monitor.last_ok_at.get(key),
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
        status = fleet_status(
            fleet.spec,
            self._records.members(fleet.namespace, self._monitor.states, self._monitor.last_ok_at),
            generation=fleet.generation,
            previous=before,
            now=self._wall(),
            fleet=fleet.name,
            policy_version=self.policy_version(fleet.namespace, fleet.name),
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
            self.forget(record.kind, record.namespace, record.name)
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
