"""Pod members: the Pods and EndpointSlices the watches pass in, and the targets fleets make of them.

A fleet's ``shardPods``/``environmentServerPods`` turn pods (by label, or behind a Service's EndpointSlices) into
targets like GenerationShards: records with ``fleet`` set, probed and published, never written to. What a pod or a
slice yields is decided by the pure :mod:`fleet_operator.discovery`; :class:`PodMembership` keeps the tables, works
out which fleets an event concerns, and feeds the resulting targets to :class:`~fleet_operator.targets.Targets`.
Every change of a member's instance identity goes through :meth:`PodMembership._observe_instance` (a refit member
becomes Stale).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fleet_operator.decisions import GENERATION_SHARD
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
from fleet_operator.records import TargetKey, observe_member
from fleet_operator.targets import Targets
from rollout_runtime.health import HealthPhase, ProbeTargetPolicy

__all__ = ["PodMembership"]

log = logging.getLogger(__name__)


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


class PodMembership:
    """The pod and EndpointSlice tables, and the pod members of every fleet (see the module docstring)."""

    def __init__(self, targets: Targets, probe_policy: ProbeTargetPolicy) -> None:
        self._targets = targets
        self._policy = probe_policy
        self._pods: dict[str, dict[str, PodView]] = {}
        """namespace -> pod name -> what its latest watch event said."""
        self._slices: dict[str, dict[str, SliceView]] = {}
        """namespace -> EndpointSlice name -> what its latest watch event said."""
        self.instance_changes = 0
        """Instance identity changes seen on known pod members (restarts, replaced pods)."""

    async def upsert_pod(self, body: Mapping[str, Any]) -> None:
        pod = observe_pod(body)
        self._pods.setdefault(pod.namespace, {})[pod.name] = pod
        await self._changed(pod.namespace, pod=pod.name)

    async def delete_pod(self, namespace: str, name: str) -> None:
        self._pods.get(namespace, {}).pop(name, None)
        await self._changed(namespace, pod=name)

    async def upsert_endpoint_slice(self, body: Mapping[str, Any]) -> None:
        view = observe_endpoint_slice(body)
        previous = self._slices.setdefault(view.namespace, {}).get(view.name)
        self._slices[view.namespace][view.name] = view
        services = {name for name in (view.service, previous.service if previous else None) if name is not None}
        await self._changed(view.namespace, services=services)

    async def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        gone = self._slices.get(namespace, {}).pop(name, None)
        services = {gone.service} if gone is not None and gone.service is not None else set()
        await self._changed(namespace, services=services)

    async def _changed(self, namespace: str, *, pod: str | None = None, services: set[str] | None = None) -> None:
        """A table changed: sync the members it may change, and wake the writer."""
        await self.sync(namespace, pod=pod, services=services)
        self._targets.wake.set()

    async def sync(
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
        records = self._targets.records
        pods = self._pods.get(namespace, {})
        slices = list(self._slices.get(namespace, {}).values())
        full = pod is None and services is None
        for record in list(records.fleets.values()):
            if record.namespace != namespace or (fleet is not None and record.name != fleet):
                continue
            chosen = selections(record.spec) if record.spec is not None else []
            by_pod = pod is not None and all(selection.service is None for _, selection in chosen)
            # One pod's event under label selections looks at that pod only (no scan of the fleet's members).
            known = {} if by_pod else records.pod_members(namespace, record.name)
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
                    before = records.targets.get(seen.key)
                    if seen.invalid is not None and (before is None or before.invalid != seen.invalid):
                        log.warning("fleet %s/%s: not probing %s", namespace, record.name, seen.invalid)
                    await self._targets.apply(seen)
                    await self._observe_instance(seen.key, member.instance)
            for key in decided - wanted:
                if key in records.targets:
                    self._targets.forget(key)

    async def _observe_instance(self, key: TargetKey, instance: str | None) -> None:
        """THE one place a pod member's instance identity is recorded, and where a change of it is acted on.

        ``instance`` is ``<pod uid>:<total container restarts>``: a change means the server behind the member
        restarted in place or was replaced, so it holds base weights and what its probes earned says nothing of the
        new one. The identity goes to the member's health state (:meth:`HealthState.observe_instance`): a member
        that was refit becomes Stale until the trainer refits it again. A member that was never refit (weights not
        tracked) starts over instead (Pending: it must pass ``successThreshold`` probes again before it takes
        traffic).
        """
        targets = self._targets
        target = targets.records.targets.get(key)
        if target is None or target.instance == instance:
            return
        previous, target.instance = target.instance, instance
        await targets.change_weights(key, lambda state: state.observe_instance(instance))  # the first one too
        if previous is None:
            return  # the first identity seen: nothing to compare with
        self.instance_changes += 1
        log.info("%s %s/%s: new instance %s (was %s)", *key, instance, previous)
        state = targets.monitor.states.get(key)
        stale = state is not None and (state.stale or state.refitting)
        if not stale and target.spec is not None and key in targets.monitor.states and targets.priming is None:
            targets.sync_monitor(reset={key})
            # the fresh state knows the new instance
            await targets.change_weights(key, lambda state: state.observe_instance(instance))
            if target.spec.drain:
                await targets.monitor.set_draining(key, True)
        targets.dirty(key.namespace)
