"""Weights on the real kube-apiserver: a refit shard killed and restarted is Stale in its status and its fleet's,
KubernetesShardSource routes nothing to it, and the trainer's refit brings it back.

The FleetEngine runs in process (real KubeClient, real HTTP probes of sim shard subprocesses) so the test can feed
it what discovery would: the shard's instance identity (`FleetEngine.observe_instance`, read here with SGLang's
`/weight_version` as the operator would read a pod's `<uid>:<restartCount>`). The trainer, a ServiceAccount with only
the chart's trainer Role, records its refits in the fleet's PolicyVersion through `PolicyVersionWriter`; the test
hands the stored object to the engine as kopf's watch would (`FleetEngine.upsert_policy_version`; the real handler
runs in tests/e2e/test_policy_version_cluster.py). State changes are awaited by watching the API, never by
sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest
from kubernetes_asyncio import client

from fleet_operator.engine import FleetEngine
from fleet_operator.kube import KubeClient
from fleet_operator.settings import OperatorSettings
from rollout_runtime.health import HttpProber
from rollout_runtime.kube import kinds
from rollout_runtime.kube.config import load_client_configuration
from rollout_runtime.shards import KubernetesShardSource, PolicyVersionWriter
from rollout_runtime.weights import weights_verdict
from support.deadlines import within
from support.operator import api_client, published_names, status_of, wait_for_object
from support.weights import WeightsFleet

pytestmark = pytest.mark.e2e

GS = "GenerationShard"


async def test_a_restarted_shard_is_stale_in_status_and_fleet_and_routed_nothing_until_refit(
    weights_fleet: Callable[[int], AbstractAsyncContextManager[WeightsFleet]],
) -> None:
    async with weights_fleet(3) as shards, api_client(shards.trainer) as trainer_api:
        ns, api, sims = shards.namespace, shards.api, shards.sims
        settings = OperatorSettings(
            namespaces=[ns],
            probe_allow_loopback=True,
            status_heartbeat_seconds=5,
            fleet_coalesce_seconds=0.2,
            leader_election=False,
            http_port=0,
        )
        kube = KubeClient(await load_client_configuration(shards.plane.kubeconfig), component="e2e", instance="e2e-0")
        prober = HttpProber(settings.probe_policy())
        engine = FleetEngine(settings, kube, prober)
        names = shards.names
        writer = PolicyVersionWriter("a", ns, api_client=trainer_api, instance=shards.instance)
        custom = client.CustomObjectsApi(api)

        async def refit(name: str, version: int) -> None:
            """What the trainer does (push the weights inside the writer's refit: the PolicyVersion records the
            version and the instance they landed on), then what discovery and kopf's watch hand the operator."""
            async with writer.refit(name, version):
                await shards.push(name, version)
            landed = await shards.instance(name)
            assert landed == f"weight_version:{version}"
            await engine.observe_instance(GS, ns, name, landed)
            stored = await custom.get_namespaced_custom_object(kinds.GROUP, kinds.VERSION, ns, "policyversions", "a")
            assert {"shard": name, "version": version, "instance": landed, "phase": "Succeeded"}.items() <= next(
                r for r in stored["spec"]["refits"] if r["shard"] == name
            ).items()
            await engine.upsert_policy_version(stored)

        await engine.prime()
        running = asyncio.create_task(engine.run(), name="engine")
        try:
            await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == names)
            await writer.publish(1)
            for name in sorted(names):
                await refit(name, 1)
            await wait_for_object(
                api, "generationshards", ns, "shard-0", lambda o: status_of(o).get("weightsVersion") == 1
            )

            await sims.kill("shard-0")
            await sims.restart("shard-0")
            restarted = await shards.instance("shard-0")
            assert restarted == "weight_version:default", "the restart did not reset the weights"
            transition = await engine.observe_instance(GS, ns, "shard-0", restarted)
            assert transition is not None

            shard = await wait_for_object(
                api, "generationshards", ns, "shard-0", lambda o: status_of(o).get("phase") == "Stale"
            )
            assert status_of(shard)["instance"] == "weight_version:default"
            assert "weightsVersion" not in status_of(shard)
            fleet_obj = await wait_for_object(
                api,
                "rolloutfleets",
                ns,
                "a",
                lambda o: status_of(o).get("staleShards") == 1 and "shard-0" not in published_names(o),
            )
            assert published_names(fleet_obj) == names - {"shard-0"}

            source = KubernetesShardSource("a", ns, api_client=trainer_api)  # the trainer Role suffices
            async with contextlib.aclosing(source.snapshots()) as snapshots:
                snapshot = await within(anext(snapshots), "KubernetesShardSource's first snapshot")
            assert snapshot.names() == frozenset(names - {"shard-0"}), "a Stale shard must get no traffic"
            assert source.weights.policy_version == 1
            assert source.weights.stale_shards()["shard-0"] is True
            assert source.weights.version_of("shard-0") is None, "an answer still in flight there must not commit"
            assert not weights_verdict(1, 1, source.weights.version_of("shard-0"), 0).committable

            await refit("shard-0", 1)
            await wait_for_object(
                api,
                "generationshards",
                ns,
                "shard-0",
                lambda o: status_of(o).get("phase") == "Healthy" and status_of(o).get("weightsVersion") == 1,
            )
            await wait_for_object(
                api,
                "rolloutfleets",
                ns,
                "a",
                lambda o: status_of(o).get("staleShards") == 0 and published_names(o) == names,
            )
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            await prober.close()
            await kube.close()
