"""``rollout-fleet status`` against the real kube-apiserver: listing fleets, every ``-o`` format, a fleet that does
not exist, and ``--watch`` showing a change. Fleets and shards are applied with their status patched in (no
operator needed to have something to show)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest
import yaml

from support.controlplane import ControlPlane
from support.deadlines import within
from support.operator import ROLLOUT_FLEET_CLI

pytestmark = pytest.mark.e2e

API = "rolloutfleet.dev/v1alpha1"
READY = {
    "type": "Ready",
    "status": "True",
    "reason": "EnoughHealthyShards",
    "lastTransitionTime": "2025-01-01T00:00:00Z",
}


def shard(name: str, fleet: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "GenerationShard",
        "metadata": {"name": name, "labels": {"fleet": fleet}},
        "spec": {"endpoint": f"http://{name}.example:8000", "model": "sim-model"},
    }


def fleet(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "RolloutFleet",
        "metadata": {"name": name},
        "spec": {"shardSelector": {"matchLabels": {"fleet": name}}, "minReadyShards": 1},
    }


def patch_status(plane: ControlPlane, namespace: str, kind: str, name: str, status: dict[str, Any]) -> None:
    plane.kubectl(
        "patch", kind, name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


@pytest.fixture
def two_fleets(fleet_crds: ControlPlane, fleet_namespace: str) -> str:
    """Fleet ``a`` (shards a0 healthy, a1 unhealthy) and fleet ``b`` (no members yet) in a fresh namespace."""
    ns = fleet_namespace
    fleet_crds.apply(shard("a0", "a"), shard("a1", "a"), fleet("a"), fleet("b"), namespace=ns)
    patch_status(fleet_crds, ns, "generationshard", "a0", {"phase": "Healthy", "latencyMilliseconds": 4.5})
    patch_status(fleet_crds, ns, "generationshard", "a1", {"phase": "Unhealthy", "lastError": "connect: refused"})
    patch_status(
        fleet_crds, ns, "rolloutfleet", "a",
        {"healthy": "1/2", "readyShards": 1, "totalShards": 2, "revision": "r1", "conditions": [READY],
         "shards": [{"name": "a0", "endpoint": "http://a0.example:8000"}]},
    )  # fmt: skip
    return ns


def status(plane: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROLLOUT_FLEET_CLI), "status", "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True, text=True, timeout=120, env={**plane.env(), "COLUMNS": "200"}, check=check,
    )  # fmt: skip


def test_status_without_a_name_lists_every_fleet_in_the_namespace(fleet_crds: ControlPlane, two_fleets: str) -> None:
    rows = status(fleet_crds, "-n", two_fleets).stdout.splitlines()
    assert rows[0].split() == ["NAME", "HEALTHY", "READY", "DEGRADED", "ENVS", "REVISION"]
    assert rows[1].split() == ["a", "1/2", "True", "Unknown", "0/0", "r1"]
    assert rows[2].split()[:2] == ["b", "0/0"]


def test_status_all_namespaces_names_each_fleets_namespace(fleet_crds: ControlPlane, two_fleets: str) -> None:
    rows = [row.split() for row in status(fleet_crds, "-A").stdout.splitlines()]
    assert rows[0][:2] == ["NAMESPACE", "NAME"]
    assert [two_fleets, "a", "1/2"] in [row[:3] for row in rows]


def test_status_json_is_a_document_with_each_fleet_and_its_members(fleet_crds: ControlPlane, two_fleets: str) -> None:
    listed = json.loads(status(fleet_crds, "-n", two_fleets, "-o", "json").stdout)
    by_name = {item["name"]: item for item in listed["items"]}
    assert set(by_name) == {"a", "b"}
    a = by_name["a"]
    assert (a["namespace"], a["healthy"], a["ready"], a["revision"]) == (two_fleets, "1/2", "True", "r1")
    members = {m["name"]: m for m in a["members"]}
    assert (members["a0"]["phase"], members["a0"]["inSet"], members["a0"]["latencyMilliseconds"]) == (
        "Healthy",
        True,
        4.5,
    )
    assert (members["a1"]["phase"], members["a1"]["inSet"], members["a1"]["lastError"]) == (
        "Unhealthy",
        False,
        "connect: refused",
    )
    assert by_name["b"]["members"] == []
    one = json.loads(status(fleet_crds, "a", "-n", two_fleets, "-o", "json").stdout)
    assert one == a, "a named fleet is its summary, the same as in the list"


def test_status_yaml_is_the_same_document(fleet_crds: ControlPlane, two_fleets: str) -> None:
    as_yaml = yaml.safe_load(status(fleet_crds, "a", "-n", two_fleets, "-o", "yaml").stdout)
    as_json = json.loads(status(fleet_crds, "a", "-n", two_fleets, "-o", "json").stdout)
    assert as_yaml == as_json


def test_status_wide_adds_columns(fleet_crds: ControlPlane, two_fleets: str) -> None:
    rows = status(fleet_crds, "-n", two_fleets, "-o", "wide").stdout.splitlines()
    assert "MIN READY" in rows[0]
    assert "NOT HEALTHY" in rows[0]
    assert "a1 (Unhealthy)" in rows[1]
    detail = status(fleet_crds, "a", "-n", two_fleets, "-o", "wide").stdout
    assert "Failures" in detail
    assert "connect: refused" in detail


def test_status_of_a_fleet_that_does_not_exist_is_one_line_and_exit_1(
    fleet_crds: ControlPlane, two_fleets: str
) -> None:
    done = status(fleet_crds, "nope", "-n", two_fleets, check=False)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"Error: RolloutFleet {two_fleets}/nope not found"]


async def test_status_watch_shows_the_fleet_again_when_it_changes(fleet_crds: ControlPlane, two_fleets: str) -> None:
    process = await asyncio.create_subprocess_exec(
        str(ROLLOUT_FLEET_CLI), "status", "a", "-n", two_fleets, "--kubeconfig", str(fleet_crds.kubeconfig),
        "-o", "json", "--watch", "--interval", "0.2", "--max-updates", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=fleet_crds.env(),
    )  # fmt: skip
    assert process.stdout is not None

    async def next_document() -> dict[str, Any]:
        assert process.stdout is not None
        lines = []
        while not lines or lines[-1] != "}":  # a pretty-printed document ends with its closing brace alone
            line = await process.stdout.readline()
            assert line, "status --watch ended before printing a whole document"
            lines.append(line.decode().rstrip("\n"))
        return dict(json.loads("\n".join(lines)))

    try:
        first = await within(next_document(), "the first document of status --watch")
        assert first["healthy"] == "1/2"
        patch_status(fleet_crds, two_fleets, "rolloutfleet", "a", {"healthy": "2/2", "readyShards": 2})
        second = await within(next_document(), "status --watch to show the change")
        assert second["healthy"] == "2/2"
        assert await within(process.wait(), "status --watch to stop after --max-updates 2") == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
