"""``rollout-fleet status``'s views, built from fleet objects without a cluster: the summary, the list table, one
fleet's detail, the json and yaml documents."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from rich.console import Console, RenderableType

from fleet_operator.status_reader import ApiServerUnreachable, watch_changes
from fleet_operator.status_table import UNKNOWN_PHASE, fleet_summary, render
from support.pods import pod

READY = {
    "type": "Ready",
    "status": "True",
    "reason": "EnoughHealthyShards",
    "lastTransitionTime": "2025-01-01T00:00:00Z",
}


def fleet(name: str, namespace: str = "rl", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"shardSelector": {"matchLabels": {"fleet": name}}, "minReadyShards": 1},
        "status": status,
    }


def shard(name: str, fleet_name: str, namespace: str = "rl", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": {"fleet": fleet_name}}, "status": status}


SHARDS = [
    shard("s0", "a", phase="Healthy", latencyMilliseconds=3.25, endpoint="http://s0:8000"),
    shard("s1", "a", phase="Unhealthy", lastError="connect: refused", consecutiveFailures=2),
    shard("b0", "b", phase="Healthy"),
    shard("s0", "a", namespace="elsewhere", phase="Healthy"),
]
FLEET_A = fleet(
    "a",
    healthy="1/2",
    revision="abc",
    readyShards=1,
    totalShards=2,
    conditions=[READY],
    shards=[{"name": "s0", "endpoint": "http://s0:8000"}],
)
FLEET_B = fleet("b", healthy="1/1")


def text(renderable: RenderableType) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_a_summary_holds_the_fleets_status_and_only_the_members_it_selects_in_its_namespace() -> None:
    summary = fleet_summary(FLEET_A, SHARDS, [])
    assert summary["namespace"] == "rl"
    assert (summary["healthy"], summary["ready"], summary["degraded"]) == ("1/2", "True", "Unknown")
    assert summary["revision"] == "abc"
    assert [(m["name"], m["phase"], m["inSet"]) for m in summary["members"]] == [
        ("s0", "Healthy", True),
        ("s1", "Unhealthy", False),
    ]
    assert summary["members"][1]["lastError"] == "connect: refused"
    assert summary["conditions"][0]["reason"] == "EnoughHealthyShards"


def test_json_of_a_list_is_an_items_document_and_of_a_named_fleet_its_summary() -> None:
    summaries = [fleet_summary(f, SHARDS, []) for f in (FLEET_A, FLEET_B)]
    listed = json.loads(str(render(summaries, "json", named=False, all_namespaces=False, namespace="rl")))
    assert [item["name"] for item in listed["items"]] == ["a", "b"]
    one = json.loads(str(render(summaries[:1], "json", named=True, all_namespaces=False, namespace="rl")))
    assert one["name"] == "a"
    assert one["members"][0]["latencyMilliseconds"] == 3.25


def test_yaml_is_the_same_document() -> None:
    summaries = [fleet_summary(FLEET_A, SHARDS, [])]
    as_yaml = yaml.safe_load(str(render(summaries, "yaml", named=False, all_namespaces=False, namespace="rl")))
    as_json = json.loads(str(render(summaries, "json", named=False, all_namespaces=False, namespace="rl")))
    assert as_yaml == as_json


def test_the_list_table_has_one_row_per_fleet_and_wide_adds_who_is_not_healthy() -> None:
    summaries = [fleet_summary(f, SHARDS, []) for f in (FLEET_A, FLEET_B)]
    table = text(render(summaries, "table", named=False, all_namespaces=False, namespace="rl")).splitlines()
    assert table[0].split() == ["NAME", "HEALTHY", "READY", "DEGRADED", "ENVS", "REVISION"]
    assert table[1].split() == ["a", "1/2", "True", "Unknown", "0/0", "abc"]
    assert table[2].split()[:2] == ["b", "1/1"]
    wide = text(render(summaries, "wide", named=False, all_namespaces=True, namespace=None)).splitlines()
    assert wide[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert "LAST HEARTBEAT" in wide[0]
    assert "s1 (Unhealthy)" in wide[1]


def test_an_empty_list_says_where_it_looked() -> None:
    assert (
        render([], "table", named=False, all_namespaces=False, namespace="rl")
        == "No RolloutFleets found in namespace rl."
    )
    assert json.loads(str(render([], "json", named=False, all_namespaces=False, namespace="rl"))) == {"items": []}


def test_one_fleets_detail_lists_its_members_and_wide_adds_probe_columns() -> None:
    summaries = [fleet_summary(FLEET_A, SHARDS, [])]
    detail = text(render(summaries, "table", named=True, all_namespaces=False, namespace="rl"))
    assert "healthy 1/2" in detail
    assert "Ready=True (EnoughHealthyShards)" in detail
    assert "Failures" not in detail
    wide = text(render(summaries, "wide", named=True, all_namespaces=False, namespace="rl"))
    assert "Failures" in wide
    assert "Last probe" in wide


class _Reads:
    """A StatusReader stand-in answering from a script: a list of summaries, or an exception to raise."""

    def __init__(self, *answers: list[dict[str, Any]] | Exception) -> None:
        self.answers = list(answers)

    async def read(self) -> list[dict[str, Any]]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def _watched(reader: _Reads, max_updates: int, warnings: list[str]) -> list[list[dict[str, Any]]]:
    changes = watch_changes(reader, interval=0, max_updates=max_updates, warn=warnings.append)  # type: ignore[arg-type]
    return [summaries async for summaries in changes]


async def test_a_watch_yields_only_changes_and_stops_after_max_updates() -> None:
    one, two = [{"name": "a", "healthy": "1/2"}], [{"name": "a", "healthy": "2/2"}]
    reader = _Reads(one, one, one, two, two)
    assert await _watched(reader, 2, []) == [one, two]
    assert reader.answers == [two], "no read after the last update"


async def test_a_watch_warns_through_an_outage_after_its_first_read_but_not_before() -> None:
    one, two = [{"name": "a", "healthy": "1/2"}], [{"name": "a", "healthy": "2/2"}]
    outage = ApiServerUnreachable("https://api:6443", "no answer within 5 s (--timeout)")
    warnings: list[str] = []
    assert await _watched(_Reads(one, outage, two), 2, warnings) == [one, two]
    assert warnings == ["cannot reach the API server at https://api:6443: no answer within 5 s (--timeout); retrying"]
    with pytest.raises(ApiServerUnreachable):
        await _watched(_Reads(outage), 1, [])


def rl_pod(name: str, **fields: Any) -> dict[str, Any]:
    """A pod in the fleets' namespace."""
    return pod(name, **{"namespace": "rl", **fields})


def pod_ref(name: str, uid: str) -> dict[str, str]:
    return {"kind": "Pod", "name": name, "uid": uid}


def pod_fleet(selection: dict[str, Any], **status: Any) -> dict[str, Any]:
    spec = {"shardPods": {"targetPort": {"name": "http"}, "model": "m", **selection}}
    return {"metadata": {"name": "p", "namespace": "rl"}, "spec": spec, "status": status}


def rows(summary: dict[str, Any]) -> list[tuple[str, str, str, bool, str | None, str | None]]:
    return [
        (m["kind"], m["name"], m["phase"], m["inSet"], m["endpoint"], m.get("instance")) for m in summary["members"]
    ]


POD_SET = {"shards": [{"name": "vllm-0", "endpoint": "http://10.1.0.5:8000", "instance": "u-0:0"}]}


def test_a_label_selected_fleet_lists_its_pod_members_with_the_operators_rules() -> None:
    pods = [
        rl_pod("vllm-0", uid="u-0", ip="10.1.0.5"),
        rl_pod("vllm-1", uid="u-1", ip="10.1.0.6", ready=False),
        rl_pod("vllm-2", uid="u-2", ip="10.1.0.7"),
        rl_pod("vllm-3", uid="u-3", ip="10.1.0.8", restarts=(1,)),
        rl_pod("other", uid="u-9", labels={"app": "other"}),
        rl_pod("vllm-9", uid="u-8", namespace="elsewhere"),
    ]
    fleet_obj = pod_fleet(
        {"selector": {"matchLabels": {"app": "vllm"}}},
        shards=[*POD_SET["shards"], {"name": "vllm-3", "endpoint": "http://10.1.0.8:8000", "instance": "u-3:0"}],
    )
    summary = fleet_summary(fleet_obj, [], [], pods)
    assert rows(summary) == [
        ("ShardPod", "vllm-0", "Healthy", True, "http://10.1.0.5:8000", "u-0:0"),
        ("ShardPod", "vllm-1", "Draining", False, "http://10.1.0.6:8000", "u-1:0"),
        ("ShardPod", "vllm-2", UNKNOWN_PHASE, False, "http://10.1.0.7:8000", "u-2:0"),
        ("ShardPod", "vllm-3", UNKNOWN_PHASE, False, "http://10.1.0.8:8000", "u-3:1"),  # the set names the old one
    ]
    shown = text(render([summary], "table", named=True, all_namespaces=False, namespace="rl"))
    assert "ShardPod" in shown
    assert "vllm-2" in shown


def test_a_service_fleet_lists_the_endpoints_of_its_slices() -> None:
    slices = [
        {
            "metadata": {"name": "vllm-x", "namespace": "rl", "labels": {"kubernetes.io/service-name": "vllm"}},
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [
                {
                    "addresses": ["10.1.0.5"],
                    "conditions": {"ready": True},
                    "targetRef": {"kind": "Pod", "name": "vllm-0", "uid": "u-0"},
                },
                {
                    "addresses": ["10.1.0.6"],
                    "conditions": {"ready": False, "terminating": True},
                    "targetRef": {"kind": "Pod", "name": "vllm-1", "uid": "u-1"},
                },
            ],
        },
        {
            "metadata": {"name": "db-x", "namespace": "rl", "labels": {"kubernetes.io/service-name": "db"}},
            "ports": [{"name": "http", "port": 5432}],
            "endpoints": [{"addresses": ["10.1.0.9"], "targetRef": pod_ref("db-0", "u-9")}],
        },
    ]
    pods = [rl_pod("vllm-0", uid="u-0", ip="10.1.0.5"), rl_pod("vllm-1", uid="u-1", ip="10.1.0.6", deleting=True)]
    summary = fleet_summary(pod_fleet({"service": "vllm"}, **POD_SET), [], [], pods, slices)
    assert rows(summary) == [
        ("ShardPod", "vllm-0", "Healthy", True, "http://10.1.0.5:8000", "u-0:0"),
        ("ShardPod", "vllm-1", "Draining", False, "http://10.1.0.6:8000", "u-1:0"),
    ]


def test_without_permission_to_list_pods_the_published_pod_members_are_shown() -> None:
    status = {"shards": [*POD_SET["shards"], {"name": "hand-written", "endpoint": "http://h:1"}]}
    summary = fleet_summary(pod_fleet({"selector": {}}, **status), [], [], None)
    assert rows(summary) == [("ShardPod", "vllm-0", "Healthy", True, "http://10.1.0.5:8000", "u-0:0")]


def test_fleets_without_pod_selections_show_no_pod_members_and_no_instance_key() -> None:
    summary = fleet_summary(FLEET_A, SHARDS, [], [rl_pod("s9", labels={"fleet": "a"})])
    assert [m["kind"] for m in summary["members"]] == ["GenerationShard", "GenerationShard"]
    assert all("instance" not in m for m in summary["members"])
