"""The cluster tier: the README's quickstart on a real node of this machine, then pods dying for real.

``scripts/cluster-quickstart`` (the README's commands) installs the chart, whose operator runs as a pod from the
image built here (tools/images.py), applies examples/ and waits for the demo fleet (the ``installed`` fixture,
conftest.py). The tests then delete, scale and kill pods through the API and watch the operator follow: kubelet,
kube-proxy, CoreDNS and containerd are real, so a deleted pod is really replaced (new UID, new IP), a scaled-down
shard's Service really has no endpoint, and a killed operator pod really loses its Lease to the next one.
"""

from __future__ import annotations

import pytest

from support.cluster import OPERATOR, Installed, sigkill_until_restarted, until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
"""The first test also brings the node up and runs the quickstart (~1.5 min warm, more on a loaded machine)."""


def test_the_quickstart_runs_the_operator_as_a_pod_and_the_demo_fleet_is_healthy(installed: Installed) -> None:
    status = installed.fleet()
    assert status["healthy"] == "2/2"
    assert [entry["name"] for entry in status["shards"]] == ["vllm-0", "vllm-1"]
    assert [entry["name"] for entry in status["environmentServers"]] == ["verifier"]
    (operator,) = installed.ready_pods(OPERATOR, "fleet-system")
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


def test_a_sigkilled_shard_container_is_restarted_by_the_kubelet_and_the_fleet_recovers(installed: Installed) -> None:
    (pod,) = installed.ready_pods("app.kubernetes.io/instance=vllm-0")
    sigkill_until_restarted(installed, pod)  # the shard process dies; its pod stays
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
    (old,) = installed.ready_pods(OPERATOR, "fleet-system")
    heartbeat = installed.fleet().get("lastHeartbeatTime")
    node.kubectl("delete", "pod", old["metadata"]["name"], "-n", "fleet-system", "--grace-period=0", "--force")
    new = until(
        "a new operator pod holding the Lease",
        lambda: [p for p in installed.ready_pods(OPERATOR, "fleet-system")
                 if p["metadata"]["name"] != old["metadata"]["name"]
                 and installed.lease_holder() == p["metadata"]["name"]],
        node,
    )  # fmt: skip
    assert new
    until("the fleet's status written again", lambda: installed.fleet().get("lastHeartbeatTime") != heartbeat, node)
