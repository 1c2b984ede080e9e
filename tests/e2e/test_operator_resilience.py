"""The operator under its least privilege and through an API server outage (real kube-apiserver, real sim shards).

- With exactly the RBAC rules the Helm chart grants (its Roles rendered by helm in namespaced mode and applied as
  they are), the operator primes, watches, probes, writes statuses and Events and holds its Lease: nothing else is
  needed.
- When the kube-apiserver is killed and restarted, the watches reconnect and the operator keeps reconciling.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollout_runtime.sim import SimFleet
from support.controlplane import ControlPlane
from support.helm import Helm
from support.operator import OperatorProcess, api_client, fleet_objects, published_names, status_of, wait_for_object
from support.trainer import operator_kubeconfig

pytestmark = pytest.mark.e2e

PROBE = {"periodSeconds": 0.5, "timeoutSeconds": 0.3, "failureThreshold": 2, "successThreshold": 2}


async def test_the_operator_needs_nothing_beyond_the_charts_rbac_rules(
    fleet_crds: ControlPlane,
    fleet_namespace: str,
    tmp_path: Path,
    helm: Helm,
    operator_processes: list[OperatorProcess],
) -> None:
    ns = fleet_namespace
    kubeconfig = operator_kubeconfig(fleet_crds, helm, ns)
    rules = fleet_crds.kubectl_json("get", "role", "rf-rollout-fleet", "-n", ns)["rules"]
    assert {"pods", "endpointslices", "policyversions"} <= {r for rule in rules for r in rule["resources"]}, rules
    async with SimFleet(2, log_dir=tmp_path / "sim") as fleet, api_client(fleet_crds.kubeconfig) as api:
        fleet_crds.apply(
            *fleet_objects(fleet.shards, PROBE, environment_endpoint=fleet.shards[0].endpoint), namespace=ns
        )
        operator = OperatorProcess(fleet_crds, ns, tmp_path, identity="least", kubeconfig=kubeconfig)
        operator_processes.append(operator)
        operator.start()
        await operator.wait_role("leader")
        published = await wait_for_object(
            api,
            "rolloutfleets",
            ns,
            "a",
            lambda o: published_names(o) == {"shard-0", "shard-1"} and status_of(o).get("readyEnvironmentServers") == 1,
        )
        assert status_of(published)["healthy"] == "2/2"
        await fleet.kill("shard-1")
        await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == {"shard-0"})
        events = fleet_crds.kubectl_json("get", "events", "-n", ns, "--field-selector=involvedObject.name=shard-1")
        assert "BecameUnhealthy" in {e["reason"] for e in events["items"]}
        assert (
            fleet_crds.kubectl_json("get", "lease", "rollout-fleet-operator", "-n", ns)["spec"]["holderIdentity"]
            == "least"
        )
    log = operator.log_tail(400)
    assert "Forbidden" not in log, log


@pytest.mark.parametrize(
    ("lease_duration", "lease_renew"),
    [(30, 2), (3, 1)],
    ids=["watches-reconnect", "steps-down-and-leads-again"],
)
async def test_the_operator_keeps_reconciling_after_the_api_server_restarts(
    fleet_crds: ControlPlane,
    fleet_namespace: str,
    tmp_path: Path,
    operator_processes: list[OperatorProcess],
    lease_duration: int,
    lease_renew: int,
) -> None:
    """With a long Lease the operator rides out the outage (kopf reconnects its watches, writes are retried); with
    a Lease shorter than the outage it steps down, campaigns again and starts a fresh term in the same process."""
    ns = fleet_namespace
    async with SimFleet(2, log_dir=tmp_path / "sim") as fleet:
        fleet_crds.apply(
            *fleet_objects(fleet.shards, PROBE, environment_endpoint=fleet.shards[0].endpoint), namespace=ns
        )
        operator = OperatorProcess(
            fleet_crds,
            ns,
            tmp_path,
            identity="survivor",
            lease_duration_seconds=lease_duration,
            lease_renew_seconds=lease_renew,
        )
        operator_processes.append(operator)
        operator.start()
        await operator.wait_role("leader")
        async with api_client(fleet_crds.kubeconfig) as api:
            await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == {"shard-0", "shard-1"})
        fleet_crds.kill_apiserver()  # every watch and connection drops at once
        await fleet.kill("shard-1")  # ...and the fleet changes while the operator cannot write
        if lease_duration < 10:  # outlast the renew deadline: the leader must step down before anyone could take over
            await operator.wait_role("standby")
        await asyncio.to_thread(fleet_crds.start_apiserver)
        async with api_client(fleet_crds.kubeconfig) as api:
            after = await wait_for_object(
                api, "rolloutfleets", ns, "a", lambda o: published_names(o) == {"shard-0"}, guard_seconds=90
            )
        assert status_of(after)["healthy"] == "1/2"
        assert operator.process.running, operator.log_tail()
        status, _ = await operator.get("/healthz")
        assert status == 200
