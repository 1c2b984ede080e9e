"""The cluster tier: the README's quickstart on a real node of this machine, then pods dying for real.

``scripts/cluster-quickstart`` (the README's commands) installs the chart, whose operator runs as a pod from the
image built here (tools/images.py), applies examples/ and waits for the demo fleet. The tests then delete, scale
and kill pods through the API and watch the operator follow: kubelet, kube-proxy, CoreDNS and containerd are real,
so a deleted pod is really replaced (new UID, new IP), a scaled-down shard's Service really has no endpoint, and a
killed operator pod really loses its Lease to the next one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from support.chart import CHART_DIR
from support.helm import Helm
from support.node import Node
from support.tools import REPO_ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
"""The first test also brings the node up and runs the quickstart (~1.5 min warm, more on a loaded machine)."""

GUARD = 240.0
"""Guards a hung wait only (a pod is Ready in 1-2.5 s here, a fleet turns in two 5 s probe periods)."""


def until(what: str, check: Callable[[], Any], node: Node, guard: float = GUARD) -> Any:
    """Poll ``check`` until it returns something truthy; on the guard, fail saying what and showing the pods."""
    deadline = time.monotonic() + guard
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)  # polling the API for a condition, with a deadline
    pods = node.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}\n{pods}")


@dataclass
class Installed:
    node: Node
    helm: Helm

    def fleet(self) -> dict[str, Any]:
        return dict(self.node.json("get", "rolloutfleet", "demo").get("status") or {})

    def pods(self, selector: str, namespace: str = "default") -> list[dict[str, Any]]:
        return list(self.node.json("get", "pods", "-l", selector, "-n", namespace)["items"])

    def ready_pods(self, selector: str, namespace: str = "default") -> list[dict[str, Any]]:
        return [
            pod
            for pod in self.pods(selector, namespace)
            if not pod["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
        ]

    def lease_holder(self) -> str:
        lease = self.node.json("get", "lease", "rollout-fleet", "-n", "fleet-system")
        return str(lease["spec"].get("holderIdentity") or "")


@pytest.fixture(scope="module")
def installed(node: Node, helm: Helm) -> Iterator[Installed]:
    """The README's quickstart, run as its script; uninstalled afterwards (CRDs kept, as Helm keeps them)."""
    env = {**os.environ, "KUBECONFIG": str(node.kubeconfig), "HELM": str(helm.binary), **helm.env(node.kubeconfig)}
    done = subprocess.run(
        [REPO_ROOT / "scripts" / "cluster-quickstart"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"the quickstart failed:\n{done.stdout}\n{done.stderr}"
    assert "demo" in done.stdout
    yield Installed(node, helm)
    node.kubectl("delete", "-f", str(REPO_ROOT / "examples"), "--wait=false", check=False)


def test_the_quickstart_runs_the_operator_as_a_pod_and_the_demo_fleet_is_healthy(installed: Installed) -> None:
    status = installed.fleet()
    assert status["healthy"] == "2/2"
    assert [entry["name"] for entry in status["shards"]] == ["vllm-0", "vllm-1"]
    assert [entry["name"] for entry in status["environmentServers"]] == ["verifier"]
    (operator,) = installed.ready_pods("app.kubernetes.io/name=rollout-fleet", "fleet-system")
    assert operator["spec"]["securityContext"]["runAsUser"] == 65532
    assert installed.lease_holder() == operator["metadata"]["name"]
    for entry in status["shards"]:  # probed through CoreDNS and kube-proxy: the Service names, not pod IPs
        assert ".svc" in entry["endpoint"]


def test_a_deleted_shard_pod_is_replaced_and_the_fleet_keeps_both_shards(installed: Installed) -> None:
    (before,) = installed.ready_pods("app.kubernetes.io/instance=vllm-0")
    installed.node.kubectl("delete", "pod", before["metadata"]["name"], "--wait=true")
    after = until(
        "a replacement vllm-0 pod, Ready",
        lambda: [p for p in installed.ready_pods("app.kubernetes.io/instance=vllm-0")
                 if p["metadata"]["uid"] != before["metadata"]["uid"]],
        installed.node,
    )  # fmt: skip
    assert after[0]["status"]["podIP"]
    until("the fleet at 2/2 with the new pod", lambda: installed.fleet().get("healthy") == "2/2", installed.node)


def container_pid(container_id: str) -> int:
    """The host pid of a container's process, from the node's containerd (this test runs on the node's machine)."""
    import node as node_tool  # tools/node.py

    ctr = node_tool.tool("containerd", "CONTAINERD_VERSION", "root", "usr", "bin", "ctr")
    address = f"--address={node_tool.RUN / 'containerd.sock'}"
    listing = [ctr, address, "--namespace=k8s.io", "tasks", "ls"]
    tasks = subprocess.run(listing, capture_output=True, text=True, check=True)
    for line in tasks.stdout.splitlines()[1:]:
        task, pid, status = line.split()
        if task == container_id and status == "RUNNING":
            return int(pid)
    raise AssertionError(f"container {container_id} is not running:\n{tasks.stdout}")


def test_a_sigkilled_shard_container_is_restarted_by_the_kubelet_and_the_fleet_recovers(installed: Installed) -> None:
    (pod,) = installed.ready_pods("app.kubernetes.io/instance=vllm-0")
    (status,) = pod["status"]["containerStatuses"]
    container_id = status["containerID"].removeprefix("containerd://")
    os.kill(container_pid(container_id), signal.SIGKILL)  # the shard process dies; its pod stays
    name = pod["metadata"]["name"]

    def restarted() -> bool:
        (now,) = installed.node.json("get", "pod", name)["status"]["containerStatuses"]
        return bool(now["restartCount"] == status["restartCount"] + 1 and now["ready"])

    until("the kubelet to restart the killed container, Ready again", restarted, installed.node)
    (now,) = installed.node.json("get", "pod", name)["status"]["containerStatuses"]
    assert now["lastState"]["terminated"]["exitCode"] == 137, now["lastState"]  # the SIGKILL hit it
    until("the fleet at 2/2 again", lambda: installed.fleet().get("healthy") == "2/2", installed.node)


def test_a_shard_scaled_to_zero_leaves_the_healthy_set_and_comes_back(installed: Installed) -> None:
    node = installed.node
    node.kubectl("scale", "deployment", "vllm-1", "--replicas=0")
    until("vllm-1 out of the healthy set", lambda: installed.fleet().get("healthy") == "1/2", node)
    shard = node.json("get", "generationshard", "vllm-1")
    assert shard["status"]["phase"] == "Unhealthy"
    node.kubectl("scale", "deployment", "vllm-1", "--replicas=1")
    until("vllm-1 back in the healthy set", lambda: installed.fleet().get("healthy") == "2/2", node)


def test_a_killed_operator_pod_is_replaced_and_the_new_one_takes_the_lease(installed: Installed) -> None:
    node = installed.node
    (old,) = installed.ready_pods("app.kubernetes.io/name=rollout-fleet", "fleet-system")
    heartbeat = installed.fleet().get("lastHeartbeatTime")
    node.kubectl("delete", "pod", old["metadata"]["name"], "-n", "fleet-system", "--grace-period=0", "--force")
    new = until(
        "a new operator pod holding the Lease",
        lambda: [p for p in installed.ready_pods("app.kubernetes.io/name=rollout-fleet", "fleet-system")
                 if p["metadata"]["name"] != old["metadata"]["name"]
                 and installed.lease_holder() == p["metadata"]["name"]],
        node,
    )  # fmt: skip
    assert new
    until("the fleet's status written again", lambda: installed.fleet().get("lastHeartbeatTime") != heartbeat, node)


def test_helm_upgrade_to_two_replicas_keeps_one_leader_and_uninstall_keeps_the_crds(installed: Installed) -> None:
    node, helm = installed.node, installed.helm
    leader = installed.lease_holder()
    helm.run(
        "upgrade", "rollout-fleet", CHART_DIR, "--namespace", "fleet-system", "--reuse-values",
        "--set", "replicaCount=2", "--wait", "--timeout=300s", kubeconfig=node.kubeconfig, timeout=400,
    )  # fmt: skip
    pods = installed.ready_pods("app.kubernetes.io/name=rollout-fleet", "fleet-system")
    assert len(pods) == 2
    assert installed.lease_holder() == leader, "adding a standby must not move the Lease"
    assert installed.fleet().get("healthy") == "2/2"
    helm.run("uninstall", "rollout-fleet", "--namespace", "fleet-system", "--wait", kubeconfig=node.kubeconfig)
    crds = json.loads(node.kubectl("get", "crd", "-o", "json").stdout)["items"]
    assert {c["metadata"]["name"] for c in crds} >= {
        "rolloutfleets.rolloutfleet.dev",
        "generationshards.rolloutfleet.dev",
    }
    assert node.json("get", "rolloutfleet", "demo")["metadata"]["name"] == "demo", "the fleets outlive the release"
