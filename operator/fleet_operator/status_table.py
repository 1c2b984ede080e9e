"""What ``rollout-fleet status`` shows, built by pure functions from the objects the API server returned.

One fleet's view is a *summary* (:func:`fleet_summary`): its status and conditions and the members its selectors
pick, each with its phase and whether it is in the published healthy set. Every output format renders summaries:
``table`` and ``wide`` as rich renderables (a list of fleets, or one fleet with its members), ``json`` and ``yaml``
as documents (one fleet: its summary; a list: ``{"items": [...]}``). The fetching is in
:mod:`fleet_operator.status_reader`; nothing here does I/O, so every format is testable without a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml
from pydantic import ValidationError
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fleet_operator import discovery
from fleet_operator.decisions import ENVIRONMENT_SERVER, GENERATION_SHARD, selector_matches
from rollout_runtime.kube import kinds
from rollout_runtime.kube.api import LabelSelector, RolloutFleetSpec, RolloutFleetStatus, read_fleet_status

__all__ = [
    "POD_MEMBER_KINDS",
    "UNKNOWN_PHASE",
    "fleet_detail",
    "fleet_summary",
    "fleet_table",
    "fleets_table",
    "pod_members",
    "render",
]

_PHASE_STYLE = {
    "Healthy": "green",
    "Suspect": "yellow",
    "Unhealthy": "red",
    "Draining": "blue",
    "Pending": "dim",
    "Stale": "magenta",
    "Refitting": "cyan",
    "Unknown": "dim",
}
POD_MEMBER_KINDS: dict[str, str] = {GENERATION_SHARD: "ShardPod", ENVIRONMENT_SERVER: "EnvironmentServerPod"}
"""The Kind column of a pod member, by the kind of target its selection yields."""
UNKNOWN_PHASE = "Unknown"
"""A pod member that may take traffic but is not in the healthy set: its probe phase (Pending, Suspect or
Unhealthy) lives in the operator only, since pod members have no object of their own."""


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _selected(items: Iterable[Mapping[str, Any]], selector: LabelSelector | None) -> list[Mapping[str, Any]]:
    if selector is None:
        return []
    return [i for i in items if selector_matches(selector, _metadata(i).get("labels") or {})]


def _member(kind: str, obj: Mapping[str, Any], in_set: set[str]) -> dict[str, Any]:
    status = obj.get("status") or {}
    name = str(_metadata(obj).get("name", "?"))
    latency = status.get("latencyMilliseconds")
    return {
        "kind": kind,
        "name": name,
        "phase": str(status.get("phase") or "Pending"),
        "inSet": name in in_set,
        "endpoint": status.get("endpoint"),
        "latencyMilliseconds": latency if isinstance(latency, int | float) else None,
        "consecutiveFailures": status.get("consecutiveFailures", 0),
        "lastProbeTime": status.get("lastProbeTime"),
        "lastError": status.get("lastError") or None,
    }


def _pod_member(kind: str, member: discovery.PodMember, in_set: Mapping[str, str | None]) -> dict[str, Any]:
    """A pod member's row; a pod is in the set only under its current instance (a restarted pod that the set still
    names with its old instance is not, until the operator admits it again)."""
    published = member.name in in_set and in_set[member.name] in (None, member.instance)
    if published:
        phase = "Healthy"
    elif member.draining:
        phase = "Draining"
    else:
        phase = UNKNOWN_PHASE
    return {
        "kind": POD_MEMBER_KINDS[kind],
        "name": member.name,
        "phase": phase,
        "inSet": published,
        "endpoint": member.endpoint or None,
        "instance": member.instance,
        "latencyMilliseconds": None,
        "consecutiveFailures": 0,
        "lastProbeTime": None,
        "lastError": None,
    }


def pod_members(
    spec: RolloutFleetSpec,
    status: RolloutFleetStatus,
    pods: Iterable[Mapping[str, Any]] | None,
    slices: Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The members a fleet's pod selections give, by the operator's own rules (:mod:`fleet_operator.discovery`),
    from the pods and EndpointSlices of the fleet's namespace.

    ``pods`` None: they could not be read (no list permission); then the members shown are the published ones only
    (the healthy-set entries that carry an ``instance``), which is all the fleet's status says about them."""
    sets = {
        GENERATION_SHARD: {e.name: e.instance for e in status.shards},
        ENVIRONMENT_SERVER: {e.name: e.instance for e in status.environment_servers},
    }
    members: list[dict[str, Any]] = []
    if pods is None:
        entries = {
            GENERATION_SHARD: [(e.name, e.endpoint, e.instance) for e in status.shards],
            ENVIRONMENT_SERVER: [(e.name, e.endpoint, e.instance) for e in status.environment_servers],
        }
        for kind, _ in discovery.selections(spec):
            for name, endpoint, instance in entries[kind]:
                if instance is not None:  # a pod member (objects' entries carry no instance)
                    member = discovery.PodMember(name, endpoint, instance, draining=False, labels={})
                    members.append(_pod_member(kind, member, sets[kind]))
        return members
    views = [discovery.observe_pod(p) for p in pods]
    by_name = {view.name: view for view in views}
    slice_views = [discovery.observe_endpoint_slice(s) for s in slices]
    for kind, selection in discovery.selections(spec):
        if selection.service is not None:
            found = discovery.slice_members(selection, slice_views, by_name)
        else:
            found = [m for m in (discovery.pod_member(selection, view) for view in views) if m is not None]
        members += [_pod_member(kind, m, sets[kind]) for m in found]
    return members


def fleet_summary(
    fleet: Mapping[str, Any],
    shards: Iterable[Mapping[str, Any]],
    environments: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] | None = (),
    slices: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One fleet and the members it selects, as a JSON-able document (camelCase, as the CRD names fields).

    ``shards`` and ``environments`` may hold other fleets' members (and, listing all namespaces, other namespaces'):
    only those in the fleet's namespace that its selectors match are kept. ``pods`` and ``slices`` (the same, for
    the fleet's pod selections) give its pod members; see :func:`pod_members`."""
    metadata = _metadata(fleet)
    namespace = metadata.get("namespace")
    try:
        spec: RolloutFleetSpec | None = RolloutFleetSpec.model_validate(fleet.get("spec") or {})
    except ValidationError:
        spec = None
    status = read_fleet_status(fleet.get("status"))
    in_set = {e.name for e in status.shards} | {e.name for e in status.environment_servers}
    conditions = {c.type: c for c in status.conditions}

    def here(items: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return [i for i in items if namespace is None or _metadata(i).get("namespace") in (None, namespace)]

    members = [
        _member(kinds.GENERATION_SHARD.kind, s, in_set)
        for s in _selected(here(shards), spec.shard_selector if spec else None)
    ]
    members += [
        _member(kinds.ENVIRONMENT_SERVER.kind, e, in_set)
        for e in _selected(here(environments), spec.environment_server_selector if spec else None)
    ]
    if spec is not None:
        members += pod_members(spec, status, None if pods is None else here(pods), here(slices))
    members.sort(key=lambda m: (m["kind"], m["name"]))
    return {
        "namespace": namespace,
        "name": metadata.get("name", "?"),
        "healthy": status.healthy,
        "ready": conditions["Ready"].status if "Ready" in conditions else "Unknown",
        "degraded": conditions["Degraded"].status if "Degraded" in conditions else "Unknown",
        "readyShards": status.ready_shards,
        "totalShards": status.total_shards,
        "readyEnvironmentServers": status.ready_environment_servers,
        "totalEnvironmentServers": status.total_environment_servers,
        "minReadyShards": spec.min_ready_shards if spec else None,
        "revision": status.revision or None,
        "lastHeartbeatTime": status.last_heartbeat_time,
        "conditions": [c.to_kube() for c in status.conditions],
        "members": members,
    }


def _phase(phase: str) -> Text:
    return Text(phase, style=_PHASE_STYLE.get(phase, ""))


def fleet_detail(summary: Mapping[str, Any], *, wide: bool = False) -> Group:
    """One fleet: a header (health, conditions, heartbeat) over its members; ``wide`` adds the probe columns."""
    conditions = ", ".join(f"{c['type']}={c['status']} ({c['reason']})" for c in summary["conditions"]) or "none yet"
    header = Text.assemble(
        ("RolloutFleet ", "bold"),
        (str(summary["name"]), "bold cyan"),
        f"  healthy {summary['healthy']}  environments {summary['readyEnvironmentServers']}/"
        f"{summary['totalEnvironmentServers']}  revision {summary['revision'] or '-'}\n",
        f"conditions: {conditions}\nlast heartbeat: {summary['lastHeartbeatTime'] or 'never'}",
    )
    columns = ["Kind", "Name", "Phase", "In set", "Endpoint", "Latency ms", "Last error"]
    if wide:
        columns[-1:-1] = ["Failures", "Last probe"]
    table = Table(show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for m in summary["members"]:
        latency = m["latencyMilliseconds"]
        cells: list[RenderableType] = [
            m["kind"],
            m["name"],
            _phase(m["phase"]),
            "yes" if m["inSet"] else "no",
            str(m["endpoint"] or "-"),
            f"{latency:.1f}" if latency is not None else "-",
            str(m["lastError"] or ""),
        ]
        if wide:
            cells[-1:-1] = [str(m["consecutiveFailures"]), str(m["lastProbeTime"] or "-")]
        table.add_row(*cells)
    return Group(header, table)


def fleet_table(
    fleet: Mapping[str, Any], shards: Iterable[Mapping[str, Any]], environments: Iterable[Mapping[str, Any]]
) -> Group:
    """The renderable for one fleet and the members it selects."""
    return fleet_detail(fleet_summary(fleet, shards, environments))


def fleets_table(summaries: Sequence[Mapping[str, Any]], *, wide: bool = False, namespaces: bool = False) -> Table:
    """Many fleets, one row each (as ``kubectl get rolloutfleets`` with the members' health added)."""
    columns = ["NAMESPACE"] * namespaces + ["NAME", "HEALTHY", "READY", "DEGRADED", "ENVS", "REVISION"]
    if wide:
        columns += ["MIN READY", "NOT HEALTHY", "LAST HEARTBEAT"]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for s in summaries:
        cells = [str(s["namespace"])] * namespaces + [
            str(s["name"]),
            str(s["healthy"]),
            str(s["ready"]),
            str(s["degraded"]),
            f"{s['readyEnvironmentServers']}/{s['totalEnvironmentServers']}",
            str(s["revision"] or "-"),
        ]
        if wide:
            unhealthy = [f"{m['name']} ({m['phase']})" for m in s["members"] if m["phase"] != "Healthy"]
            cells += [
                "-" if s["minReadyShards"] is None else str(s["minReadyShards"]),
                ", ".join(unhealthy) or "-",
                str(s["lastHeartbeatTime"] or "never"),
            ]
        table.add_row(*cells)
    return table


def render(
    summaries: Sequence[Mapping[str, Any]], output: str, *, named: bool, all_namespaces: bool, namespace: str | None
) -> RenderableType:
    """What ``status -o <output>`` prints (``table``, ``wide``, ``json``, ``yaml``): one named fleet's detail or
    document, or the list of them. A document is a ``str``, to be printed as it is."""
    if output in ("json", "yaml"):
        document: Any = dict(summaries[0]) if named else {"items": [dict(s) for s in summaries]}
        if output == "json":
            return json.dumps(document, indent=2)
        return yaml.safe_dump(document, sort_keys=False).rstrip("\n")
    wide = output == "wide"
    if named:
        return fleet_detail(summaries[0], wide=wide)
    if not summaries:
        return "No RolloutFleets found" + ("." if all_namespaces else f" in namespace {namespace}.")
    return fleets_table(summaries, wide=wide, namespaces=all_namespaces)
