"""Members discovered from pods, pure: which members a set of pods (or a Service's EndpointSlices) yields for a
fleet, each member's instance identity, and the inputs beside probes that decide whether it may take traffic.

A RolloutFleet's ``shardPods`` / ``environmentServerPods`` select pods in the fleet's namespace, by label or as the
endpoints of a Service (its EndpointSlices), InferencePool-style. Each selected pod is one member:

- **Where**: the pod IP the API reports (``status.podIP``, written by the kubelet, never by the fleet's author) at
  ``targetPort`` (a number, or a container port name resolved per pod). A pod without an IP or without that port
  is not a member yet; a Succeeded or Failed pod is not a member.
- **May it take traffic** (:attr:`PodMember.draining`): a pod that is terminating (``deletionTimestamp`` set) or
  not Ready is held out of the healthy set (phase Draining: in-flight attempts finish or are redispatched, probes
  keep running); readiness alone never admits one, probes still decide.
- **Identity** (:attr:`PodMember.instance`): ``<pod uid>:<total container restartCount>``. An in-place container
  restart keeps the pod IP and becomes Ready again, so readiness alone misses it; the restart count and a new pod
  UID (a replaced pod, a recreated LeaderWorkerSet group) do not.
- **LeaderWorkerSet**: one group is one shard. Pods labelled with a LeaderWorkerSet worker index other than ``0``
  are workers of a leader's group and never members; the leader (index 0) is, and a group recreation (LWS's
  default ``RecreateGroupOnPodRestart``) gives it a new UID: a new instance.

The engine's pod membership (:mod:`fleet_operator.membership`) keeps the tables of :class:`PodView` and
:class:`SliceView` from its watches and turns members into probe targets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from fleet_operator.decisions import ENVIRONMENT_SERVER, GENERATION_SHARD, selector_matches
from rollout_runtime.kube.api import (
    EnvironmentServerPods,
    EnvironmentServerSpec,
    GenerationShardSpec,
    PodSelection,
    RolloutFleetSpec,
    ShardPods,
)

__all__ = [
    "LWS_GROUP_INDEX",
    "LWS_NAME",
    "LWS_WORKER_INDEX",
    "SERVICE_NAME_LABEL",
    "PodMember",
    "PodView",
    "SliceEndpoint",
    "SliceView",
    "instance_identity",
    "is_lws_worker",
    "member_spec",
    "member_url",
    "observe_endpoint_slice",
    "observe_pod",
    "pod_member",
    "selections",
    "slice_members",
    "target_name",
]

LWS_NAME: Final[str] = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX: Final[str] = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX: Final[str] = "leaderworkerset.sigs.k8s.io/worker-index"
"""LeaderWorkerSet's labels on every pod of a group; the leader's worker index is ``"0"``."""
SERVICE_NAME_LABEL: Final[str] = "kubernetes.io/service-name"
"""The label the EndpointSlice controller puts on each slice: the Service it belongs to."""
_TERMINAL_PHASES: Final[frozenset[str]] = frozenset({"Succeeded", "Failed"})


def instance_identity(uid: str, restarts: int) -> str:
    """A pod member's instance: ``<pod uid>:<total container restartCount>``."""
    return f"{uid}:{restarts}"


def is_lws_worker(labels: Mapping[str, str]) -> bool:
    """A LeaderWorkerSet worker (not the group's leader): part of its leader's shard, never a member itself."""
    index = labels.get(LWS_WORKER_INDEX)
    return index is not None and index != "0"


@dataclass(frozen=True)
class PodView:
    """What the operator keeps of one pod (from its watch events)."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    ip: str | None
    ready: bool
    terminating: bool
    terminal: bool
    """Succeeded or Failed: its containers will not run again."""
    restarts: int
    """Total ``restartCount`` over its containers."""
    ports: Mapping[str, int] = field(default_factory=dict)
    """Container port name -> number."""

    @property
    def instance(self) -> str:
        return instance_identity(self.uid, self.restarts)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def observe_pod(body: Mapping[str, Any]) -> PodView:
    """Read a pod's watch event body (malformed parts read as absent, never raise)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    ports: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for port in (container or {}).get("ports") or []:
            name, number = (port or {}).get("name"), (port or {}).get("containerPort")
            if isinstance(name, str) and isinstance(number, int) and name not in ports:
                ports[name] = number
    conditions = status.get("conditions") or []
    ready = any(
        (c or {}).get("type") == "Ready" and (c or {}).get("status") == "True"
        for c in conditions
        if isinstance(c, dict)
    )
    restarts = sum(_int((c or {}).get("restartCount")) for c in status.get("containerStatuses") or [])
    ip = status.get("podIP")
    return PodView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        ip=ip if isinstance(ip, str) and ip else None,
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        terminal=status.get("phase") in _TERMINAL_PHASES,
        restarts=restarts,
        ports=ports,
    )


@dataclass(frozen=True)
class SliceEndpoint:
    """One endpoint of an EndpointSlice."""

    address: str
    pod: str | None
    """``targetRef`` name when it is a Pod."""
    uid: str | None
    ready: bool
    terminating: bool


@dataclass(frozen=True)
class SliceView:
    """What the operator keeps of one EndpointSlice."""

    namespace: str
    name: str
    service: str | None
    ports: Mapping[str, int]
    """Port name ("" when unnamed) -> number."""
    endpoints: tuple[SliceEndpoint, ...]


def observe_endpoint_slice(body: Mapping[str, Any]) -> SliceView:
    """Read an EndpointSlice's watch event body (malformed parts read as absent, never raise)."""
    meta = body.get("metadata") or {}
    ports: dict[str, int] = {}
    for port in body.get("ports") or []:
        if isinstance(port, dict) and isinstance(port.get("port"), int):
            ports.setdefault(str(port.get("name") or ""), port["port"])
    endpoints = []
    for endpoint in body.get("endpoints") or []:
        if not isinstance(endpoint, dict) or not endpoint.get("addresses"):
            continue
        conditions = endpoint.get("conditions") or {}
        ref = endpoint.get("targetRef") or {}
        is_pod = ref.get("kind") == "Pod"
        endpoints.append(
            SliceEndpoint(
                address=str(endpoint["addresses"][0]),
                pod=str(ref["name"]) if is_pod and ref.get("name") else None,
                uid=str(ref["uid"]) if is_pod and ref.get("uid") else None,
                ready=conditions.get("ready") is not False,  # unset means ready (the API's rule)
                terminating=conditions.get("terminating") is True,
            )
        )
    return SliceView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        service=(meta.get("labels") or {}).get(SERVICE_NAME_LABEL),
        ports=ports,
        endpoints=tuple(endpoints),
    )


@dataclass(frozen=True)
class PodMember:
    """One member a pod yields for one fleet."""

    name: str
    """The pod's name: the member's name in the healthy set."""
    endpoint: str
    instance: str
    draining: bool
    """Held out of the healthy set: the pod is terminating or not Ready."""
    labels: Mapping[str, str]


def member_url(scheme: str, ip: str, port: int) -> str:
    """``scheme://ip:port`` (IPv6 in brackets); raises ValueError for something that is not an IP address."""
    address = ipaddress.ip_address(ip)
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"{scheme}://{host}:{port}"


def _port(selection: PodSelection, pod: PodView) -> int | None:
    ref = selection.target_port
    return ref.number if ref.number is not None else pod.ports.get(ref.name or "")


def pod_member(selection: PodSelection, pod: PodView) -> PodMember | None:
    """The member ``pod`` is for a fleet selecting by label (None: not selected, or not a member yet)."""
    if selection.selector is None or not selector_matches(selection.selector, pod.labels):
        return None
    if is_lws_worker(pod.labels) or pod.terminal or pod.ip is None:
        return None
    port = _port(selection, pod)
    if port is None:
        return None
    try:
        endpoint = member_url(selection.scheme, pod.ip, port)
    except ValueError:
        return None
    return PodMember(
        name=pod.name,
        endpoint=endpoint,
        instance=pod.instance,
        draining=pod.terminating or not pod.ready,
        labels=pod.labels,
    )


def slice_members(selection: PodSelection, slices: Iterable[SliceView], pods: Mapping[str, PodView]) -> list[PodMember]:
    """The members behind ``selection.service``: its slices' endpoints (``pods``: the namespace's pods by name).

    An endpoint backed by a known pod takes that pod's identity and readiness as well; others use the slice's
    conditions and the target's UID. LeaderWorkerSet workers are skipped as for label selection.
    """
    members: dict[str, PodMember] = {}
    for view in slices:
        if view.service != selection.service:
            continue
        ref = selection.target_port
        port = view.ports.get(ref.name) if ref.name is not None else ref.number
        for endpoint in view.endpoints:
            pod = pods.get(endpoint.pod) if endpoint.pod is not None else None
            if pod is not None and pod.uid != (endpoint.uid or pod.uid):
                pod = None  # the slice still names the old pod of that name
            labels = pod.labels if pod is not None else {}
            if is_lws_worker(labels) or port is None:
                continue
            try:
                url = member_url(selection.scheme, endpoint.address, port)
            except ValueError:
                continue
            name = endpoint.pod or endpoint.address
            draining = endpoint.terminating or not endpoint.ready
            if pod is not None:
                instance = pod.instance
                draining = draining or pod.terminating or not pod.ready
            else:
                instance = endpoint.uid or endpoint.address
            members.setdefault(name, PodMember(name, url, instance, draining, labels))
    return [members[name] for name in sorted(members)]


def selections(spec: RolloutFleetSpec) -> list[tuple[str, PodSelection]]:
    """A fleet's pod selections with the kind of target each yields."""
    found: list[tuple[str, PodSelection]] = []
    if spec.shard_pods is not None:
        found.append((GENERATION_SHARD, spec.shard_pods))
    if spec.environment_server_pods is not None:
        found.append((ENVIRONMENT_SERVER, spec.environment_server_pods))
    return found


def target_name(fleet: str, member: str) -> str:
    """A pod member's target name: per fleet, since two fleets may select one pod with different probe settings."""
    return f"{fleet}/{member}"


def member_spec(selection: PodSelection, member: PodMember) -> GenerationShardSpec | EnvironmentServerSpec:
    """The target spec a member is probed and published with (as if a GenerationShard/EnvironmentServer said it)."""
    common: dict[str, Any] = {
        "endpoint": member.endpoint,
        "weight": selection.weight,
        "drain": member.draining,
        "probe": selection.probe,
    }
    if isinstance(selection, ShardPods):
        return GenerationShardSpec(model=selection.model, max_model_len=selection.max_model_len, **common)
    assert isinstance(selection, EnvironmentServerPods)
    return EnvironmentServerSpec(
        protocol=selection.protocol,
        episode_timeout_seconds=selection.episode_timeout_seconds,
        max_concurrent_episodes=selection.max_concurrent_episodes,
        **common,
    )
