"""The reconciliation engine against kmock's Kubernetes emulator: status shapes, write coalescing, restarts.

The engine's real KubeClient talks HTTP to the emulator; probes come from a scripted prober, and time is passed
explicitly to ``write_pass`` (no sleeps): what is asserted is what reached the API server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest

from fleet_operator.engine import FleetEngine
from fleet_operator.kube import KubeClient
from fleet_operator.settings import OperatorSettings
from rollout_runtime.health import HealthPhase, ProbeReason, ProbeResult, ProbeSettings
from rollout_runtime.kube.api import API_VERSION
from rollout_runtime.kube.config import load_client_configuration
from support.kmockfix import VersionedKubernetesEmulator

NS = "team-a"
HEARTBEAT = 60.0
COALESCE = 0.5
PROBE = {"periodSeconds": 1, "timeoutSeconds": 0.5, "failureThreshold": 2, "successThreshold": 2}
RESOURCES = {
    "generationshards": "GenerationShard",
    "environmentservers": "EnvironmentServer",
    "rolloutfleets": "RolloutFleet",
}


class ScriptedProber:
    """Answers probes from a table: endpoint -> healthy or not. Counts probes."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.probes = 0

    async def probe(self, endpoint: str, settings: ProbeSettings, *, expected_model: str | None = None) -> ProbeResult:
        self.probes += 1
        if endpoint in self.down:
            return ProbeResult.failure(ProbeReason.CONNECT, "connection refused", latency_seconds=0.001, at=1e9)
        return ProbeResult.success(latency_seconds=0.002, at=1e9 + self.probes)


def shard_body(name: str, *, fleet: str = "a", drain: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "GenerationShard",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1, "labels": {"fleet": fleet}},
        "spec": {
            "endpoint": f"http://{name}.example:8000",
            "model": "m",
            "maxModelLen": 4096,
            "probe": PROBE,
            "drain": drain,
        },
    }


def env_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "EnvironmentServer",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1, "labels": {"fleet": "a"}},
        "spec": {"endpoint": f"http://{name}.example:9000", "protocol": "verifier", "probe": PROBE},
    }


def fleet_body(name: str = "a", min_ready: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "RolloutFleet",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-fleet-{name}", "generation": 2},
        "spec": {
            "shardSelector": {"matchLabels": {"fleet": name}},
            "environmentServerSelector": {"matchLabels": {"fleet": name}},
            "minReadyShards": min_ready,
        },
    }


def status_patches(emulator: VersionedKubernetesEmulator, plural: str | None = None) -> list[kmock.Request]:
    return [
        r
        for r in emulator
        if r.method == kmock.method.PATCH
        and r.subresource == "status"
        and (plural is None or (r.resource is not None and r.resource.plural == plural))
    ]


def events(emulator: VersionedKubernetesEmulator) -> list[dict[str, Any]]:
    return [
        r.data
        for r in emulator
        if r.method == kmock.method.POST and r.resource is not None and r.resource.plural == "events"
    ]


def stored(emulator: VersionedKubernetesEmulator, plural: str, name: str) -> dict[str, Any]:
    return dict(emulator.objects[f"rolloutfleet.dev/v1alpha1/{plural}", NS, name])


@pytest.fixture
async def emulator(kube_emulator: VersionedKubernetesEmulator) -> VersionedKubernetesEmulator:
    for plural, kind in RESOURCES.items():
        kube_emulator.resources[f"rolloutfleet.dev/v1alpha1/{plural}"] = {
            "kind": kind,
            "namespaced": True,
            "subresources": ["status"],
        }
    return kube_emulator


@pytest.fixture
async def kube(emulator: VersionedKubernetesEmulator, tmp_path: Path) -> AsyncIterator[KubeClient]:
    configuration = await load_client_configuration(emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    client = KubeClient(configuration, component="test", instance="test-0")
    yield client
    await client.close()


def put(emulator: VersionedKubernetesEmulator, plural: str, body: dict[str, Any]) -> None:
    emulator.objects[f"rolloutfleet.dev/v1alpha1/{plural}", NS, body["metadata"]["name"]] = body


def make_engine(kube: KubeClient, prober: ScriptedProber) -> FleetEngine:
    settings = OperatorSettings(
        status_heartbeat_seconds=HEARTBEAT, fleet_coalesce_seconds=COALESCE, leader_election=False, http_port=0
    )
    return FleetEngine(settings, kube, prober, wall_clock=lambda: 1_700_000_000.0)


async def healthy_fleet(
    emulator: VersionedKubernetesEmulator, kube: KubeClient, shards: int = 3
) -> tuple[FleetEngine, ScriptedProber, float]:
    for i in range(shards):
        put(emulator, "generationshards", shard_body(f"s{i}"))
    put(emulator, "environmentservers", env_body("env0"))
    put(emulator, "rolloutfleets", fleet_body())
    prober = ScriptedProber()
    engine = make_engine(kube, prober)
    await engine.prime()
    await engine.probe_now()
    await engine.probe_now()  # successThreshold = 2
    now = asyncio.get_running_loop().time() + COALESCE
    await engine.write_pass(now)
    return engine, prober, now


async def test_fleet_status_publishes_the_healthy_set_counts_revision_and_conditions(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    await healthy_fleet(emulator, kube)
    status = stored(emulator, "rolloutfleets", "a")["status"]
    assert status["healthy"] == "3/3"
    assert (status["readyShards"], status["totalShards"]) == (3, 3)
    assert (status["readyEnvironmentServers"], status["totalEnvironmentServers"]) == (1, 1)
    assert status["shards"][0] == {
        "name": "s0",
        "endpoint": "http://s0.example:8000",
        "model": "m",
        "maxModelLen": 4096,
        "weight": 1.0,
        "lastSuccessTime": "2001-09-09T01:46:45Z",
    }
    assert [e["name"] for e in status["environmentServers"]] == ["env0"]
    assert len(status["revision"]) == 16
    assert status["observedGeneration"] == 2
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Degraded"]["status"]) == ("True", "False")
    shard = stored(emulator, "generationshards", "s0")["status"]
    assert shard["phase"] == "Healthy"
    assert shard["endpoint"] == "http://s0.example:8000"
    assert shard["conditions"][0]["type"] == "Ready"
    assert shard["conditions"][0]["status"] == "True"
    assert shard["observedGeneration"] == 1


async def test_steady_probes_cause_no_writes_until_the_heartbeat(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    engine, _, now = await healthy_fleet(emulator, kube)
    assert len(status_patches(emulator, "generationshards")) == 3
    assert len(status_patches(emulator, "environmentservers")) == 1
    assert len(status_patches(emulator, "rolloutfleets")) == 1
    for second in range(1, 30):
        await engine.probe_now()
        await engine.write_pass(now + second)
    assert len(status_patches(emulator)) == 5, "probes alone must not write"
    await engine.write_pass(now + HEARTBEAT + 1)
    assert len(status_patches(emulator, "generationshards")) == 6, "one heartbeat write per shard"
    assert len(status_patches(emulator, "rolloutfleets")) == 2, "one heartbeat write per fleet"
    await engine.write_pass(now + HEARTBEAT + 2)
    assert len(status_patches(emulator)) == 10


async def test_a_burst_of_shard_transitions_becomes_one_fleet_write(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    engine, prober, _now = await healthy_fleet(emulator, kube, shards=5)
    fleet_writes = len(status_patches(emulator, "rolloutfleets"))
    prober.down = {f"http://s{i}.example:8000" for i in range(5)}
    loop_now = asyncio.get_running_loop().time()
    for _ in range(2):  # failureThreshold = 2: Healthy -> Suspect -> Unhealthy
        await engine.probe_now()
        await engine.write_pass(loop_now)  # inside the coalescing window: shard statuses only
    assert [stored(emulator, "generationshards", f"s{i}")["status"]["phase"] for i in range(5)] == ["Unhealthy"] * 5
    assert len(status_patches(emulator, "rolloutfleets")) == fleet_writes
    await engine.write_pass(asyncio.get_running_loop().time() + COALESCE)
    assert len(status_patches(emulator, "rolloutfleets")) == fleet_writes + 1
    status = stored(emulator, "rolloutfleets", "a")["status"]
    assert (status["healthy"], status["shards"]) == ("0/5", [])
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "False", "Degraded": "True"}


async def test_transitions_post_events_and_flip_the_shard_ready_condition(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    engine, prober, now = await healthy_fleet(emulator, kube, shards=1)
    prober.down = {"http://s0.example:8000"}
    await engine.probe_now()
    await engine.probe_now()
    await engine.write_pass(now + 1)
    reasons = [(e["involvedObject"]["name"], e["reason"], e["type"]) for e in events(emulator)]
    assert ("s0", "BecameHealthy", "Normal") in reasons
    assert ("s0", "BecameSuspect", "Warning") in reasons
    assert ("s0", "BecameUnhealthy", "Warning") in reasons
    assert ("a", "FleetNotReady", "Warning") in reasons
    ready = stored(emulator, "generationshards", "s0")["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "Unhealthy")
    assert "connect: connection refused" in stored(emulator, "generationshards", "s0")["status"]["lastError"]


async def test_draining_takes_a_shard_out_of_the_healthy_set_without_a_probe(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    engine, prober, _now = await healthy_fleet(emulator, kube, shards=2)
    probes = prober.probes
    await engine.upsert_target("GenerationShard", shard_body("s1", drain=True))
    await engine.write_pass(asyncio.get_running_loop().time() + COALESCE)
    assert prober.probes == probes
    assert engine.phase("GenerationShard", NS, "s1") is HealthPhase.DRAINING
    status = stored(emulator, "rolloutfleets", "a")["status"]
    assert [e["name"] for e in status["shards"]] == ["s0"]
    assert status["healthy"] == "1/2"


async def test_a_relabelled_shard_leaves_the_fleet_and_a_new_one_joins_pending(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    engine, _, _ = await healthy_fleet(emulator, kube, shards=2)
    for body in (shard_body("s1", fleet="other"), shard_body("s9")):
        put(emulator, "generationshards", body)
        await engine.upsert_target("GenerationShard", body)
    await engine.write_pass(asyncio.get_running_loop().time() + COALESCE)
    status = stored(emulator, "rolloutfleets", "a")["status"]
    assert [e["name"] for e in status["shards"]] == ["s0"]
    assert status["healthy"] == "1/2"
    assert "GenerationShard/s9 (Pending)" in {c["type"]: c for c in status["conditions"]}["Degraded"]["message"]


async def test_an_object_deleted_behind_our_back_is_forgotten_on_its_next_write(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    engine, _, now = await healthy_fleet(emulator, kube, shards=2)
    emulator.objects["rolloutfleet.dev/v1alpha1/generationshards", NS, "s1"].delete()
    await engine.probe_now()
    await engine.write_pass(now + HEARTBEAT + 1)  # the heartbeat write gets 404
    assert engine.phase("GenerationShard", NS, "s1") is None
    await engine.write_pass(now + HEARTBEAT + 1 + COALESCE)
    assert stored(emulator, "rolloutfleets", "a")["status"]["healthy"] == "1/1"


async def test_a_restarted_engine_resumes_from_persisted_status_without_rewriting_it(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    await healthy_fleet(emulator, kube)
    writes = len(status_patches(emulator))
    revision = stored(emulator, "rolloutfleets", "a")["status"]["revision"]
    successor = make_engine(kube, ScriptedProber())
    await successor.prime()
    assert successor.phase("GenerationShard", NS, "s0") is HealthPhase.HEALTHY
    await successor.write_pass(asyncio.get_running_loop().time() + COALESCE)
    assert len(status_patches(emulator)) == writes
    assert stored(emulator, "rolloutfleets", "a")["status"]["revision"] == revision


async def test_a_restarted_refit_shard_is_stale_in_its_status_and_the_fleets_until_refit(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    engine, _prober, _now = await healthy_fleet(emulator, kube, shards=2)
    loop = asyncio.get_running_loop()
    await engine.observe_instance("GenerationShard", NS, "s0", "uid-s0:0")
    await engine.record_refit("GenerationShard", NS, "s0", 3, "uid-s0:0")
    await engine.write_pass(loop.time() + COALESCE + HEARTBEAT)
    shard = stored(emulator, "generationshards", "s0")["status"]
    assert (shard["phase"], shard["instance"], shard["weightsVersion"]) == ("Healthy", "uid-s0:0", 3)
    assert stored(emulator, "rolloutfleets", "a")["status"]["staleShards"] == 0

    transition = await engine.observe_instance("GenerationShard", NS, "s0", "uid-s0:1")  # a container restart
    assert transition is not None
    assert transition.to_phase is HealthPhase.STALE
    await engine.write_pass(loop.time() + 2 * (COALESCE + HEARTBEAT))
    shard = stored(emulator, "generationshards", "s0")["status"]
    assert shard["phase"] == "Stale"
    assert shard["instance"] == "uid-s0:1"
    assert "weightsVersion" not in shard
    fleet = stored(emulator, "rolloutfleets", "a")["status"]
    assert [e["name"] for e in fleet["shards"]] == ["s1"], "a Stale shard must not be in the healthy set"
    assert fleet["staleShards"] == 1

    await engine.record_refit("GenerationShard", NS, "s0", 4, "uid-s0:1")
    await engine.write_pass(loop.time() + 3 * (COALESCE + HEARTBEAT))
    shard = stored(emulator, "generationshards", "s0")["status"]
    assert (shard["phase"], shard["weightsVersion"]) == ("Healthy", 4)
    fleet = stored(emulator, "rolloutfleets", "a")["status"]
    assert [e["name"] for e in fleet["shards"]] == ["s0", "s1"]
    assert fleet["staleShards"] == 0


def policy_body(version: int, refits: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "PolicyVersion",
        "metadata": {"name": "a", "namespace": NS, "uid": "uid-policy-a", "generation": 1},
        "spec": {"policyVersion": version, "refits": refits},
    }


def refit(shard: str, version: int, instance: str, at: str) -> dict[str, Any]:
    return {"shard": shard, "version": version, "instance": instance, "phase": "Succeeded", "time": at}


async def test_the_trainers_policy_version_drives_refits_replays_and_lag(
    emulator: VersionedKubernetesEmulator, kube: KubeClient
) -> None:
    """Refits arrive through the PolicyVersion; after an operator restart the re-listed refit of a crashed
    container does not lift its successor; a new refit does; a newer policy version makes lagging shards Stale."""
    engine, prober, _now = await healthy_fleet(emulator, kube, shards=2)
    loop = asyncio.get_running_loop()
    for name in ("s0", "s1"):
        await engine.observe_instance("GenerationShard", NS, name, f"uid-{name}:0")  # what pod discovery feeds
    first = policy_body(1, [refit("s0", 1, "uid-s0:0", "T1"), refit("s1", 1, "uid-s1:0", "T1")])
    await engine.upsert_policy_version(first)
    await engine.write_pass(loop.time() + COALESCE + HEARTBEAT)
    fleet = stored(emulator, "rolloutfleets", "a")["status"]
    assert fleet["policyVersion"] == 1
    assert [(w["name"], w.get("weightsVersion"), w["stale"]) for w in fleet["shardWeights"]] == [
        ("s0", 1, False),
        ("s1", 1, False),
    ]

    await engine.observe_instance("GenerationShard", NS, "s0", "uid-s0:1")  # a container restart
    await engine.write_pass(loop.time() + 2 * (COALESCE + HEARTBEAT))
    assert stored(emulator, "generationshards", "s0")["status"]["phase"] == "Stale"

    successor = make_engine(kube, prober)  # the operator restarted: everything is re-listed
    await successor.prime()
    await successor.upsert_policy_version(first)
    assert successor.phase("GenerationShard", NS, "s0") is HealthPhase.STALE, "a replayed refit lifted a restart"
    assert successor.phase("GenerationShard", NS, "s1") is HealthPhase.HEALTHY

    again = policy_body(1, [refit("s0", 1, "uid-s0:1", "T2"), refit("s1", 1, "uid-s1:0", "T1")])
    await successor.upsert_policy_version(again)
    assert successor.phase("GenerationShard", NS, "s0") is not HealthPhase.STALE
    await successor.probe_now()
    await successor.probe_now()  # resumed from a persisted Stale: it earns Healthy by probes, as any resumed target
    assert successor.phase("GenerationShard", NS, "s0") is HealthPhase.HEALTHY

    await successor.upsert_policy_version(policy_body(2, again["spec"]["refits"]))
    assert successor.phase("GenerationShard", NS, "s0") is HealthPhase.STALE
    assert successor.phase("GenerationShard", NS, "s1") is HealthPhase.STALE
    await successor.write_pass(loop.time() + 3 * (COALESCE + HEARTBEAT))
    fleet = stored(emulator, "rolloutfleets", "a")["status"]
    assert (fleet["policyVersion"], fleet["staleShards"], fleet["shards"]) == (2, 2, [])
