"""The trainer's PolicyVersion on the real kube-apiserver, written with the chart's trainer Role and nothing more.

The trainer is a ServiceAccount with a real TokenRequest token, bound to the Role the chart renders for
``rbac.trainer.bindings``; it publishes and refits through the runtime's ``PolicyVersionWriter``. The operator is
the real ``rollout-fleet operator`` process (its kopf handler watches PolicyVersions). State changes are awaited by
watching the API, never by sleeping.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rollout_runtime.kube.config import load_client_configuration
from rollout_runtime.shards import KubernetesShardSource, PolicyVersionWriter
from rollout_runtime.weights import weights_verdict
from support.controlplane import ControlPlane
from support.deadlines import within
from support.helm import Helm
from support.operator import OperatorProcess, published_names, status_of, wait_for_object
from support.trainer import trainer_kubeconfig
from support.weights import WeightsFleet

pytestmark = pytest.mark.e2e


def weights_of(obj: dict[str, Any]) -> dict[str, int | None]:
    return {entry["name"]: entry.get("weightsVersion") for entry in status_of(obj).get("shardWeights", [])}


def can_i(plane: ControlPlane, namespace: str, verb: str, resource: str) -> bool:
    result = plane.kubectl(
        "auth", "can-i", verb, resource, f"--namespace={namespace}", f"--as=system:serviceaccount:{namespace}:trainer",
        check=False,
    )  # fmt: skip
    return result.stdout.strip() == "yes"


def test_the_trainer_role_grants_the_policy_version_and_nothing_else(
    fleet_crds: ControlPlane, fleet_namespace: str, helm: Helm
) -> None:
    ns = fleet_namespace
    trainer_kubeconfig(fleet_crds, helm, ns)
    allowed = [("create", "policyversions"), ("patch", "policyversions"), ("get", "policyversions")]
    allowed += [("watch", "rolloutfleets")]
    for verb, resource in allowed:
        assert can_i(fleet_crds, ns, verb, resource), f"the trainer must be able to {verb} {resource}"
    denied = [
        ("patch", "rolloutfleets"),
        ("patch", "rolloutfleets/status"),
        ("patch", "generationshards"),
        ("patch", "generationshards/status"),
        ("delete", "policyversions"),
        ("get", "configmaps"),
        ("get", "secrets"),
        ("list", "pods"),
    ]
    for verb, resource in denied:
        assert not can_i(fleet_crds, ns, verb, resource), f"the trainer must not {verb} {resource}"
    other = fleet_crds.create_namespace(f"{ns}-other")
    result = fleet_crds.kubectl(
        "auth", "can-i", "create", "policyversions", f"--namespace={other}",
        f"--as=system:serviceaccount:{ns}:trainer", check=False,
    )  # fmt: skip
    assert result.stdout.strip() == "no", "the trainer Role is namespaced: no PolicyVersion in another namespace"


async def test_a_published_policy_makes_lagging_shards_stale_and_a_refit_brings_each_back(
    weights_fleet: Callable[[int], AbstractAsyncContextManager[WeightsFleet]],
    tmp_path: Path,
    operator_processes: list[OperatorProcess],
) -> None:
    """The trainer (trainer Role only) publishes policy 1 and refits every shard through the real operator; then
    publishes 2: every shard lags (maxWeightsLag 0), is Stale and routed nothing; refitting one brings only it back.
    The runtime's FleetWeights (KubernetesShardSource.weights) sees the same, so its gate commits only on-policy
    answers."""
    async with weights_fleet(2) as shards:
        ns, api, names, push = shards.namespace, shards.api, shards.names, shards.push
        operator = OperatorProcess(shards.plane, ns, tmp_path, identity="op-w")
        operator_processes.append(operator)
        operator.start()
        await operator.wait_role("leader")
        await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == names)

        async with (
            client.ApiClient(await load_client_configuration(shards.trainer)) as trainer_api,
            PolicyVersionWriter("a", ns, api_client=trainer_api, instance=shards.instance) as writer,
        ):
            await writer.publish(1)
            failures = await writer.refit_all(1, lambda name: push(name, 1), sorted(names))
            assert failures == {}
            on_policy = await wait_for_object(
                api, "rolloutfleets", ns, "a", lambda o: weights_of(o) == dict.fromkeys(names, 1)
            )
            assert status_of(on_policy)["policyVersion"] == 1
            assert published_names(on_policy) == names
            shard = await wait_for_object(
                api, "generationshards", ns, "shard-0", lambda o: status_of(o).get("weightsVersion") == 1
            )
            assert status_of(shard)["instance"] == "weight_version:1"

            await writer.publish(2)
            lagging = await wait_for_object(
                api,
                "rolloutfleets",
                ns,
                "a",
                lambda o: status_of(o).get("policyVersion") == 2 and status_of(o).get("staleShards") == len(names),
            )
            assert published_names(lagging) == set(), "shards lagging beyond maxWeightsLag must get no traffic"
            source = KubernetesShardSource("a", ns, api_client=trainer_api)
            async with contextlib.aclosing(source.snapshots()) as snapshots:
                snapshot = await within(anext(snapshots), "KubernetesShardSource's first snapshot")
            assert snapshot.names() == frozenset()
            assert source.weights.policy_version == 2
            assert source.weights.stale_shards() == dict.fromkeys(names, True)
            assert not weights_verdict(2, None, source.weights.version_of("shard-0"), 0).committable

            async with writer.refit("shard-0", 2):
                await push("shard-0", 2)
            back = await wait_for_object(
                api,
                "rolloutfleets",
                ns,
                "a",
                lambda o: published_names(o) == {"shard-0"} and status_of(o)["staleShards"] == 1,
            )
            assert weights_of(back) == {"shard-0": 2, "shard-1": None}
            async with contextlib.aclosing(source.snapshots()) as snapshots:
                snapshot = await within(anext(snapshots), "KubernetesShardSource's snapshot after the refit")
            assert snapshot.names() == frozenset({"shard-0"})
            assert weights_verdict(2, 2, source.weights.version_of("shard-0"), 0).committable
        stored = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            "rolloutfleet.dev", "v1alpha1", ns, "policyversions", "a"
        )
        refits = {r["shard"]: (r["version"], r["phase"], r.get("instance")) for r in stored["spec"]["refits"]}
        assert refits == {
            "shard-0": (2, "Succeeded", "weight_version:2"),
            "shard-1": (1, "Succeeded", "weight_version:1"),
        }
