"""The operator end to end: real kube-apiserver, `rollout-fleet operator` as a subprocess, simulated shards on
127.0.0.1 killed and restarted for real, and a trainer-side Dispatcher following the fleet through
KubernetesShardSource. State changes are awaited by watching the API, never by sleeping; no test asserts on time
(detection times are printed for the record)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rollout_runtime.dispatch import Completed, Dispatcher
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import KubernetesShardSource, Shard
from rollout_runtime.sim import SimFleet, expected_answer
from support.controlplane import ControlPlane
from support.deadlines import within
from support.dispatch import assert_accounted, by_kind, collect
from support.operator import OperatorProcess, api_client, status_of, wait_for_object

pytestmark = pytest.mark.e2e

API = "rolloutfleet.dev/v1alpha1"
PROBE = {"periodSeconds": 0.5, "timeoutSeconds": 0.3, "failureThreshold": 2, "successThreshold": 2}


def shard_object(shard: Shard, *, fleet: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "GenerationShard",
        "metadata": {"name": shard.name, "labels": {"fleet": fleet}},
        "spec": {"endpoint": shard.endpoint, "model": shard.model, "maxModelLen": 4096, "probe": PROBE},
    }


def fleet_object(name: str = "a", **policy: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "RolloutFleet",
        "metadata": {"name": name},
        "spec": {"shardSelector": {"matchLabels": {"fleet": name}}, "minReadyShards": 1, "policy": policy},
    }


def in_set(obj: dict[str, Any]) -> set[str]:
    return {entry["name"] for entry in status_of(obj).get("shards", [])}


@contextlib.asynccontextmanager
async def operated_fleet(
    plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    operators: list[OperatorProcess],
    count: int = 3,
    **settings: Any,
) -> AsyncIterator[tuple[SimFleet, client.ApiClient, OperatorProcess]]:
    """Sim shards, their GenerationShards and fleet `a`, and a leading operator; yields once all are healthy."""
    async with SimFleet(count, log_dir=tmp_path / "sim") as fleet, api_client(plane.kubeconfig) as api:
        plane.apply(*(shard_object(s) for s in fleet.shards), fleet_object(), namespace=namespace)
        operator = OperatorProcess(plane, namespace, tmp_path, identity="op-a", **settings)
        operators.append(operator)
        operator.start()
        await operator.wait_role("leader")
        names = set(fleet.names)
        await wait_for_object(api, "rolloutfleets", namespace, "a", lambda o: in_set(o) == names)
        yield fleet, api, operator


async def test_killed_shard_leaves_the_healthy_set_and_returns_after_success_threshold_probes(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    ns = fleet_namespace
    async with operated_fleet(fleet_crds, ns, tmp_path, operator_processes) as (fleet, api, operator):
        revision = status_of(await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: True))["revision"]
        killed_at = time.monotonic()
        await fleet.kill("shard-1")
        left = await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: "shard-1" not in in_set(o))
        print(f"\nshard-1 left the published healthy set {time.monotonic() - killed_at:.2f} s after SIGKILL")
        assert in_set(left) == {"shard-0", "shard-2"}
        assert status_of(left)["healthy"] == "2/3"
        assert status_of(left)["revision"] != revision
        degraded = {c["type"]: c for c in status_of(left)["conditions"]}["Degraded"]
        assert (degraded["status"], degraded["reason"]) == ("True", "MembersNotHealthy")
        assert "GenerationShard/shard-1 (Unhealthy)" in degraded["message"]

        dead = status_of(fleet_crds.kubectl_json("get", "generationshard", "shard-1", "-n", ns))
        assert dead["phase"] == "Unhealthy"
        assert dead["consecutiveFailures"] == PROBE["failureThreshold"], "written on the transition, not later"
        assert dead["lastError"].startswith("connect:")

        await fleet.restart("shard-1")
        back = await wait_for_object(
            api, "generationshards", ns, "shard-1", lambda o: status_of(o).get("phase") == "Healthy"
        )
        assert status_of(back)["consecutiveSuccesses"] == PROBE["successThreshold"]
        rejoined = await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: "shard-1" in in_set(o))
        assert status_of(rejoined)["revision"] == revision, "the same set has the same revision"

        events = fleet_crds.kubectl_json("get", "events", "-n", ns, "--field-selector=involvedObject.name=shard-1")
        reasons = [e["reason"] for e in events["items"]]
        assert {"BecameSuspect", "BecameUnhealthy", "BecameHealthy"} <= set(reasons)
        assert (
            await operator.metric(
                "fleet_shard_healthy", {"namespace": ns, "kind": "GenerationShard", "name": "shard-1"}
            )
            == 1
        )
        transitions = await operator.metric(
            "fleet_health_transitions_total",
            {"kind": "GenerationShard", "from_phase": "Suspect", "to_phase": "Unhealthy"},
        )
        assert transitions == 1

        rows = fleet_crds.kubectl("get", "gshard", "-n", ns).stdout.splitlines()
        assert rows[0].split() == ["NAME", "PHASE", "MODEL", "LATENCY-MS", "AGE"]
        assert all(row.split()[1:3] == ["Healthy", "sim-model"] for row in rows[1:])
        fleets = fleet_crds.kubectl("get", "rolloutfleets", "-n", ns).stdout.splitlines()
        assert fleets[1].split()[:3] == ["a", "3/3", "True"]


async def test_a_target_outside_the_allowlist_is_never_probed_and_never_healthy(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    ns = fleet_namespace
    async with operated_fleet(fleet_crds, ns, tmp_path, operator_processes, count=1) as (_, api, operator):
        metadata_service = {
            "apiVersion": API,
            "kind": "GenerationShard",
            "metadata": {"name": "metadata", "labels": {"fleet": "a"}},
            "spec": {"endpoint": "http://169.254.169.254", "probe": PROBE},
        }
        outside = {**metadata_service, "metadata": {"name": "outside", "labels": {"fleet": "a"}}}
        outside["spec"] = {**metadata_service["spec"], "endpoint": "http://10.1.2.3:8000"}
        fleet_crds.apply(metadata_service, outside, namespace=ns)
        for name in ("metadata", "outside"):
            refused = await wait_for_object(
                api, "generationshards", ns, name, lambda o: status_of(o).get("phase") == "Unhealthy"
            )
            assert status_of(refused)["lastError"].startswith("forbidden_target:")
        fleet_state = await wait_for_object(
            api, "rolloutfleets", ns, "a", lambda o: status_of(o).get("totalShards") == 3
        )
        assert in_set(fleet_state) == {"shard-0"}
        assert (
            await operator.metric(
                "fleet_probe_failures_total", {"kind": "GenerationShard", "reason": "forbidden_target"}
            )
            >= 4
        )


async def test_trainer_dispatcher_following_the_fleet_completes_a_batch_while_shards_die(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    ns = fleet_namespace
    async with operated_fleet(fleet_crds, ns, tmp_path, operator_processes) as (fleet, _, _):
        fleet_crds.apply(
            fleet_object(
                "a",
                backoffInitialSeconds=0.05,
                backoffMaxSeconds=0.5,
                healthyWaitSeconds=60,
                attemptTimeoutSeconds=30,
                stallDeadlineSeconds=120,
                ejectionBaseSeconds=2,
                ejectionMaxSeconds=10,
                maxConcurrency=6,
            ),
            namespace=ns,
        )
        source = KubernetesShardSource("a", ns, kubeconfig=fleet_crds.kubeconfig)
        policy = await source.dispatch_policy()
        assert (policy.attempt_timeout_seconds, policy.max_concurrency, policy.stall_action) == (30, 6, "warn")
        completions = 0
        enough = asyncio.Event()
        batch = [f"What is {i} + {i * 3}?" for i in range(60)]

        async with GenerationClient(timeout_seconds=30, connect_timeout_seconds=5) as generation:

            async def rollout(shard: Shard, prompt: str) -> str:
                nonlocal completions
                completion = await generation.complete(shard, prompt, max_tokens=8)
                completions += 1
                if completions >= 10:
                    enough.set()
                return completion.text

            async def chaos() -> None:
                await enough.wait()
                await fleet.kill("shard-0")
                fleet.hang("shard-2")

            async with Dispatcher(source, policy, seed=0) as dispatcher:
                chaos_task = asyncio.create_task(chaos())
                run = dispatcher.run(batch, rollout)
                outcomes = await collect(run, seconds=120)
                await within(chaos_task, "the kill and the hang to be injected")
                fleet.resume("shard-2")

    assert_accounted(run, outcomes, range(len(batch)))
    # The faults must have hit attempts (a kill or hang that found nothing in flight would prove nothing).
    assert run.stats.redispatches > 0, run.stats
    completed = by_kind(outcomes)["completed"]
    assert len(completed) == len(batch)
    for outcome in completed:
        assert isinstance(outcome, Completed)
        assert outcome.result.strip() == expected_answer(outcome.prompt)


async def test_an_unspecified_address_target_stays_refused_though_it_would_reach_a_live_loopback_shard(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    """``http://0.0.0.0:P`` and ``http://[::]:P`` connect to this host: with a live shard on P and an allowlist of
    every address (``::/0``), they stay Unhealthy with forbidden_target and never enter the healthy set."""
    ns = fleet_namespace
    everything = {"probe_allowed_hosts": '["0.0.0.0/0", "::/0"]'}
    async with operated_fleet(fleet_crds, ns, tmp_path, operator_processes, count=1, **everything) as (fleet, api, _):
        port = fleet.shards[0].endpoint.rsplit(":", 1)[1]
        anys = []
        for name, host in (("any4", "0.0.0.0"), ("any6", "[::]"), ("mapped", "[::ffff:0.0.0.0]")):
            anys.append(
                {
                    "apiVersion": API,
                    "kind": "GenerationShard",
                    "metadata": {"name": name, "labels": {"fleet": "a"}},
                    "spec": {"endpoint": f"http://{host}:{port}", "model": "sim-model", "probe": PROBE},
                }
            )
        fleet_crds.apply(*anys, namespace=ns)
        for shard in anys:
            refused = await wait_for_object(
                api,
                "generationshards",
                ns,
                shard["metadata"]["name"],
                lambda o: status_of(o).get("phase") == "Unhealthy",
            )
            assert status_of(refused)["lastError"].startswith("forbidden_target:"), status_of(refused)
        fleet_state = await wait_for_object(
            api, "rolloutfleets", ns, "a", lambda o: status_of(o).get("totalShards") == 4
        )
        assert in_set(fleet_state) == {"shard-0"}
