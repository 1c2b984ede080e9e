"""The cluster tier's last module: ``helm upgrade`` to two operator replicas, the chart's PodDisruptionBudget
honoured by the Eviction API, then ``helm uninstall`` (the CRDs and the fleets stay). It must run after every other
cluster module: they share the one release (conftest.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.cluster import OPERATOR, Installed, until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]


def test_helm_upgrade_to_two_replicas_keeps_one_leader(installed: Installed) -> None:
    leader = installed.lease_holder()
    installed.upgrade("replicaCount=2")
    pods = installed.ready_pods(OPERATOR, "fleet-system")
    assert len(pods) == 2
    assert installed.lease_holder() == leader, "adding a standby must not move the Lease"
    assert installed.fleet().get("healthy") == "2/2"


def evict(installed: Installed, pod: str) -> tuple[bool, str]:
    """POST an Eviction for an operator pod (what ``kubectl drain`` does per pod): (accepted, the API's answer)."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": "fleet-system"}}
    done = installed.node.kubectl(
        "create", "--raw", f"/api/v1/namespaces/fleet-system/pods/{pod}/eviction", "-f", "-",
        check=False, stdin=json.dumps(eviction),
    )  # fmt: skip
    return done.returncode == 0, done.stdout + done.stderr


def test_an_eviction_that_would_break_the_operators_pod_disruption_budget_is_refused(installed: Installed) -> None:
    """With the node cordoned (a drain's first step) no evicted operator pod can be replaced: the chart's PDB
    (maxUnavailable 1) lets the standby go and refuses the leader, so a drain never takes the last operator."""
    node = installed.node
    leader = installed.lease_holder()
    pods = {p["metadata"]["name"] for p in installed.ready_pods(OPERATOR, "fleet-system")}
    (standby,) = pods - {leader}
    node.kubectl("cordon", node.name)
    try:
        accepted, answer = evict(installed, standby)
        assert accepted, answer

        def no_disruption_left() -> dict[str, Any] | None:
            budget = node.json("get", "pdb", "rollout-fleet", "-n", "fleet-system")
            pending = [p for p in installed.pods(OPERATOR, "fleet-system") if p["status"].get("phase") == "Pending"]
            return budget if budget["status"].get("disruptionsAllowed") == 0 and pending else None

        pdb = until("the PDB to allow no more disruptions, the standby's replacement Pending", no_disruption_left, node)
        assert pdb["spec"]["maxUnavailable"] == 1
        accepted, answer = evict(installed, leader)
        assert not accepted, f"the leader's eviction was accepted: {answer}"
        assert "disruption budget" in answer, answer
        assert installed.lease_holder() == leader
        assert leader in {p["metadata"]["name"] for p in installed.ready_pods(OPERATOR, "fleet-system")}
    finally:
        node.kubectl("uncordon", node.name)
    until("two operator pods Ready again", lambda: len(installed.ready_pods(OPERATOR, "fleet-system")) == 2, node)


def test_helm_uninstall_keeps_the_crds_and_the_fleets(installed: Installed) -> None:
    node, helm = installed.node, installed.helm
    helm.run("uninstall", "rollout-fleet", "--namespace", "fleet-system", "--wait", kubeconfig=node.kubeconfig)
    crds = json.loads(node.kubectl("get", "crd", "-o", "json").stdout)["items"]
    assert {c["metadata"]["name"] for c in crds} >= {
        "rolloutfleets.rolloutfleet.dev",
        "generationshards.rolloutfleet.dev",
    }
    assert node.json("get", "rolloutfleet", "demo")["metadata"]["name"] == "demo", "the fleets outlive the release"
