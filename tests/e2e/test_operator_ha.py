"""High availability and watch robustness on the real kube-apiserver: two operator replicas behind one Lease, a
graceful SIGTERM hand-over that keeps the published healthy set intact, and the trainer's source re-listing after
410 Gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rollout_runtime.shards import HealthySet, KubernetesShardSource
from rollout_runtime.sim import SimFleet
from support.controlplane import ControlPlane
from support.deadlines import within
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
