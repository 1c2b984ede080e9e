"""High availability and watch robustness on the real kube-apiserver: two operator replicas behind one Lease, a
graceful SIGTERM hand-over that keeps the published healthy set intact, and the trainer's source re-listing after
410 Gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from rollout_runtime.shards import HealthySet, KubernetesShardSource
from rollout_runtime.sim import SimFleet
from support.controlplane import ControlPlane
from support.deadlines import deadline, within
from support.operator import (
    API,
    OperatorProcess,
    api_client,
    fleet_objects,
    published_names,
    wait_for_object,
)

pytestmark = pytest.mark.e2e

PROBE = {"periodSeconds": 0.5, "timeoutSeconds": 0.3, "failureThreshold": 2, "successThreshold": 2}


async def test_one_of_two_replicas_leads_and_sigterm_hands_over_without_emptying_the_set(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    ns = fleet_namespace
    async with SimFleet(2, log_dir=tmp_path / "sim") as fleet, api_client(fleet_crds.kubeconfig) as api:
        fleet_crds.apply(*fleet_objects(fleet.shards, PROBE), namespace=ns)
        first, second = (OperatorProcess(fleet_crds, ns, tmp_path, identity=name) for name in ("op-a", "op-b"))
        operator_processes.extend([first, second])
        first.start()
        await first.wait_role("leader")
        second.start()
        await second.wait_role("standby")
        both = {"shard-0", "shard-1"}
        await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == both)

        published: list[HealthySet] = []
        source = KubernetesShardSource("a", ns, kubeconfig=fleet_crds.kubeconfig)

        async def follow() -> None:
            async with contextlib.aclosing(source.snapshots()) as snapshots:
                async for snapshot in snapshots:
                    published.append(snapshot)

        follower = asyncio.create_task(follow())
        try:
            assert await second.metric("fleet_status_writes_total") == 0, "a standby never writes"
            lease = fleet_crds.kubectl_json("get", "lease", "rollout-fleet-operator", "-n", ns)
            assert lease["spec"]["holderIdentity"] == "op-a"

            assert await first.stop() == 0, first.log_tail()
            await second.wait_role("leader")  # released on SIGTERM: no need to wait for the Lease to expire
            lease = fleet_crds.kubectl_json("get", "lease", "rollout-fleet-operator", "-n", ns)
            assert lease["spec"]["holderIdentity"] == "op-b"

            await fleet.kill("shard-0")
            await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == {"shard-1"})
            assert await second.metric("fleet_status_writes_total") > 0
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        sets = [snapshot.names() for snapshot in published]
        assert sets[0] == both
        assert sets[-1] == {"shard-1"}
        assert all(s == both for s in sets[:-1]), f"the hand-over must not shrink the set: {sets}"


def role_missing_one_verb(namespace: str) -> dict[str, Any]:
    """Everything a namespaced operator needs, except listing RolloutFleets: a replica of a new version whose RBAC
    lacks one rule (set by hand, or a rule the new version needs and the cluster's roles do not have yet)."""
    read = ["get", "list", "watch"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "operator-but-fleets-unlistable", "namespace": namespace},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
            {
                "apiGroups": ["rolloutfleet.dev"],
                "resources": ["generationshards", "environmentservers", "policyversions"],
                "verbs": [*read, "patch"],
            },
            {"apiGroups": ["rolloutfleet.dev"], "resources": ["rolloutfleets"], "verbs": ["get", "watch", "patch"]},
            {"apiGroups": ["rolloutfleet.dev"], "resources": ["*/status"], "verbs": ["get", "patch"]},
        ],
    }


async def test_a_replica_that_cannot_lead_is_never_ready_so_a_rolling_update_keeps_the_leader(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    """Issue 36: a Deployment's rolling update (and ``helm upgrade --wait``) removes the old pod once the new one is
    Ready. A standby used to answer /readyz 200 before it had ever started kopf, so a new replica that could not lead
    replaced the working leader and crash-looped once it took the Lease. Now a replica rehearses a term first (prime,
    then kopf until it is ready, writing nothing): one that cannot is never Ready and never campaigns."""
    ns = fleet_namespace
    async with SimFleet(1, log_dir=tmp_path / "sim") as fleet, api_client(fleet_crds.kubeconfig) as api:
        fleet_crds.apply(*fleet_objects(fleet.shards, PROBE), namespace=ns)
        leader = OperatorProcess(fleet_crds, ns, tmp_path, identity="op-old")
        operator_processes.append(leader)
        leader.start()
        await leader.wait_role("leader")

        fleet_crds.apply(role_missing_one_verb(ns))
        kubeconfig = fleet_crds.service_account_kubeconfig(ns, "operator-new")
        fleet_crds.kubectl(
            "create", "rolebinding", "operator-new", f"--namespace={ns}",
            "--role=operator-but-fleets-unlistable", f"--serviceaccount={ns}:operator-new",
        )  # fmt: skip
        denied = fleet_crds.kubectl("get", "rolloutfleets", f"--namespace={ns}", kubeconfig=kubeconfig, check=False)
        assert denied.returncode != 0
        assert "forbidden" in denied.stderr.lower(), denied.stderr
        successor = OperatorProcess(fleet_crds, ns, tmp_path, identity="op-new", kubeconfig=kubeconfig)
        operator_processes.append(successor)
        successor.start()

        answers: list[tuple[int, str]] = []
        async with deadline(lambda: f"op-new to give up; /readyz answered {answers[-3:]}", 60):
            while successor.process.running:
                with contextlib.suppress(aiohttp.ClientError):
                    answers.append(await successor.get("/readyz"))
                    assert answers[-1][0] != 200, f"a replica that cannot lead answered Ready: {answers[-1][1]}"
                await asyncio.sleep(0.1)  # poll interval of an external process's endpoint, not synchronisation
        assert successor.process.returncode == 1, successor.log_tail()
        log = successor.process.log_path.read_text()
        assert "cannot lead" in log, successor.log_tail()
        assert "403" in log, successor.log_tail()  # the fault hit: the list it may not make

        lease = fleet_crds.kubectl_json("get", "lease", "rollout-fleet-operator", "-n", ns)
        assert lease["spec"]["holderIdentity"] == "op-old"
        status, body = await leader.get("/readyz")
        assert (status, json.loads(body)["role"]) == (200, "leader")
        await fleet.kill("shard-0")  # and the old leader is still reconciling
        await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == set())


async def test_a_standby_is_ready_only_after_it_started_kopf_once(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    """The other side of the rehearsal: a healthy standby does become Ready (a rolling update can proceed), and its
    log shows kopf started under its own identity before it did, while the leader kept the Lease."""
    ns = fleet_namespace
    async with SimFleet(1, log_dir=tmp_path / "sim") as fleet:
        fleet_crds.apply(*fleet_objects(fleet.shards, PROBE), namespace=ns)
        first, second = (OperatorProcess(fleet_crds, ns, tmp_path, identity=name) for name in ("op-a", "op-b"))
        operator_processes.extend([first, second])
        first.start()
        await first.wait_role("leader")
        second.start()
        async with deadline(lambda: "op-b to be a Ready standby", 60):
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    status, body = await second.get("/readyz")
                    if status == 200:
                        break
                await asyncio.sleep(0.1)  # poll interval of an external process's endpoint, not synchronisation
        assert json.loads(body)["role"] == "standby"
        log = second.process.log_path.read_text()
        assert "rehearsal passed: primed and started kopf as op-b" in log, second.log_tail()
        assert await second.metric("fleet_status_writes_total") == 0, "the rehearsal writes nothing"
        lease = fleet_crds.kubectl_json("get", "lease", "rollout-fleet-operator", "-n", ns)
        assert lease["spec"]["holderIdentity"] == "op-a"


class StaleFirstList(KubernetesShardSource):
    """A source whose first list answers with a resourceVersion etcd no longer has: its watch gets 410 Gone."""

    async def _list(self, api: client.CustomObjectsApi) -> tuple[str, HealthySet]:
        resource_version, snapshot = await super()._list(api)
        return ("1" if self.relists == 1 else resource_version), snapshot


async def test_the_trainer_source_relists_after_410_gone_and_keeps_following(
    fleet_crds: ControlPlane, fleet_namespace: str
) -> None:
    ns = fleet_namespace
    fleet_crds.apply(
        {"apiVersion": API, "kind": "RolloutFleet", "metadata": {"name": "a"}, "spec": {"shardSelector": {}}},
        namespace=ns,
    )
    status = {"revision": "r1", "shards": [{"name": "s1", "endpoint": "http://10.0.0.1:8000", "weight": 1}]}
    patch_status(fleet_crds, ns, status)
    source = StaleFirstList("a", ns, kubeconfig=fleet_crds.kubeconfig)
    async with contextlib.aclosing(source.snapshots()) as snapshots:
        first = await anext(snapshots)
        assert (first.revision, first.names()) == ("r1", frozenset({"s1"}))
        status["revision"], status["shards"] = "r2", []
        patch_status(fleet_crds, ns, status)
        second = await within(anext(snapshots), "the source's snapshot after the 410 Gone relist", 60)
    assert (second.revision, second.shards) == ("r2", ())
    assert source.relists == 2, "the stale watch got 410 Gone and the source listed again"


def patch_status(plane: ControlPlane, namespace: str, status: dict[str, Any]) -> None:
    body = json.dumps({"status": status})
    plane.kubectl("patch", "rolloutfleet", "a", "-n", namespace, "--subresource=status", "--type=merge", "-p", body)
