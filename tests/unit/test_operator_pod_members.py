"""The engine with pod members: pods in, fleet statuses out, through the same probe and write paths as
GenerationShards. A fake KubeApi lists the objects and records the PATCHes; a fake prober answers."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from fleet_operator.engine import FleetEngine
from fleet_operator.kube import WriteOutcome
from fleet_operator.settings import OperatorSettings
from rollout_runtime.health import HealthPhase, ProbeResult, ProbeSettings
from support.pods import pod

NS = "ns"
PROBE = {"periodSeconds": 5, "timeoutSeconds": 1, "failureThreshold": 1, "successThreshold": 1}
FLEET: dict[str, Any] = {
    "metadata": {"name": "a", "namespace": NS, "uid": "fa", "generation": 1},
    "spec": {
        "shardPods": {
            "selector": {"matchLabels": {"app": "vllm"}},
            "targetPort": {"name": "http"},
            "model": "m",
            "probe": PROBE,
        }
    },
}


class Api:
    def __init__(self, pods: list[dict[str, Any]], fleet_status: dict[str, Any] | None = None) -> None:
        self.pods = pods
        self.fleet = copy.deepcopy(FLEET)
        if fleet_status is not None:
            self.fleet["status"] = fleet_status
        self.statuses: dict[tuple[str, str], dict[str, Any]] = {}

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> WriteOutcome:
        self.statuses[(plural, name)] = status
        return WriteOutcome.WRITTEN

    async def post_event(self, ref: Any, *, type_: str, reason: str, message: str) -> None:
        return None

    async def list_objects(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        return {"pods": self.pods, "rolloutfleets": [self.fleet]}.get(plural, [])


class Prober:
    def __init__(self) -> None:
        self.probed: list[str] = []

    async def probe(self, endpoint: str, settings: ProbeSettings, *, expected_model: str | None = None) -> ProbeResult:
        self.probed.append(endpoint)
        return ProbeResult.success(latency_seconds=0.001)


def engine_for(api: Api, prober: Prober, **settings: Any) -> FleetEngine:
    config = OperatorSettings(
        status_heartbeat_seconds=60,
        fleet_coalesce_seconds=0,
        leader_election=False,
        http_port=0,
        probe_allowed_hosts=["10.1.0.0/16"],
        **settings,
    )
    return FleetEngine(config, api, prober, wall_clock=lambda: 1_700_000_000.0)


async def published(engine: FleetEngine, api: Api) -> dict[str, str | None]:
    """Probe once, write once: the fleet's healthy set as name -> instance."""
    await engine.probe_now()
    await engine.write_pass(asyncio.get_running_loop().time() + 1)
    status = api.statuses[("rolloutfleets", "a")]
    return {entry["name"]: entry.get("instance") for entry in status["shards"]}


async def test_each_selected_pod_is_probed_and_published_with_its_instance_and_writes_only_the_fleet() -> None:
    api, prober = Api([pod("vllm-0", uid="u0", ip="10.1.0.5"), pod("vllm-1", uid="u1", ip="10.1.0.6")]), Prober()
    engine = engine_for(api, prober)
    await engine.prime()
    assert await published(engine, api) == {"vllm-0": "u0:0", "vllm-1": "u1:0"}
    assert sorted(set(prober.probed)) == ["http://10.1.0.5:8000", "http://10.1.0.6:8000"]
    assert set(api.statuses) == {("rolloutfleets", "a")}, "pod members have no object to write a status to"
    entry = api.statuses[("rolloutfleets", "a")]["shards"][0]
    assert (entry["endpoint"], entry["model"]) == ("http://10.1.0.5:8000", "m")


async def test_a_container_restart_changes_the_instance_and_the_member_must_earn_its_place_again() -> None:
    api, prober = Api([pod("vllm-0", uid="u0", ip="10.1.0.5")]), Prober()
    engine = engine_for(api, prober)
    await engine.prime()
    assert await published(engine, api) == {"vllm-0": "u0:0"}
    await engine.upsert_pod(pod("vllm-0", uid="u0", ip="10.1.0.5", restarts=(1,)))  # same IP, restartCount+1
    assert engine.instance_changes == 1
    assert engine.phase("GenerationShard", NS, "a/vllm-0") is HealthPhase.PENDING
    assert await published(engine, api) == {"vllm-0": "u0:1"}, "back after successThreshold probes, new instance"
    await engine.upsert_pod(pod("vllm-0", uid="u9", ip="10.1.0.5", restarts=(1,)))  # a new pod, same name
    assert engine.instance_changes == 2
    assert await published(engine, api) == {"vllm-0": "u9:1"}


async def test_a_refit_pod_member_that_restarts_is_stale_until_the_trainer_refits_it() -> None:
    """Pod identity is restart evidence for the weights state machine: probes alone would re-admit base weights."""
    api, prober = Api([pod("vllm-0", uid="u0", ip="10.1.0.5")]), Prober()
    engine = engine_for(api, prober)
    await engine.prime()
    assert await published(engine, api) == {"vllm-0": "u0:0"}
    await engine.record_refit("GenerationShard", NS, "a/vllm-0", 3, identity="u0:0")
    await engine.upsert_pod(pod("vllm-0", uid="u0", ip="10.1.0.5", restarts=(1,)))  # same IP, restartCount+1
    assert engine.instance_changes == 1
    assert engine.phase("GenerationShard", NS, "a/vllm-0") is HealthPhase.STALE
    assert await published(engine, api) == {}, "a stale member takes no traffic, however well it probes"
    await engine.record_refit("GenerationShard", NS, "a/vllm-0", 3, identity="u0:1")
    assert await published(engine, api) == {"vllm-0": "u0:1"}


def policy_version(version: int, refits: list[tuple[str, str]]) -> dict[str, Any]:
    """Fleet a's PolicyVersion as the trainer writes it: refits as (member name as published, instance)."""
    entries = [
        {"shard": shard, "version": version, "instance": instance, "phase": "Succeeded"} for shard, instance in refits
    ]
    return {
        "metadata": {"name": "a", "namespace": NS, "uid": "pv"},
        "spec": {"policyVersion": version, "refits": entries},
    }


async def test_a_policy_version_refits_a_pod_member_by_the_pod_name_the_fleet_publishes() -> None:
    """The trainer knows a pod member by the name in the fleet's status (its pod's), not the operator's per-fleet
    target name: a refit under that name is recorded, the restart makes it Stale, the next refit brings it back."""
    api, prober = Api([pod("vllm-0", uid="u0", ip="10.1.0.5")]), Prober()
    engine = engine_for(api, prober)
    await engine.prime()
    assert await published(engine, api) == {"vllm-0": "u0:0"}
    await engine.upsert_policy_version(policy_version(3, [("vllm-0", "u0:0")]))
    assert await published(engine, api) == {"vllm-0": "u0:0"}
    assert api.statuses[("rolloutfleets", "a")]["shardWeights"] == [
        {"name": "vllm-0", "weightsVersion": 3, "stale": False}
    ]
    await engine.upsert_pod(pod("vllm-0", uid="u0", ip="10.1.0.5", restarts=(1,)))
    assert engine.phase("GenerationShard", NS, "a/vllm-0") is HealthPhase.STALE
    assert await published(engine, api) == {}
    await engine.upsert_policy_version(policy_version(3, [("vllm-0", "u0:1")]))
    assert await published(engine, api) == {"vllm-0": "u0:1"}


async def test_a_terminating_pod_is_draining_and_a_deleted_one_leaves() -> None:
    api, prober = Api([pod("vllm-0", uid="u0"), pod("vllm-1", uid="u1", ip="10.1.0.6")]), Prober()
    engine = engine_for(api, prober)
    await engine.prime()
    assert set(await published(engine, api)) == {"vllm-0", "vllm-1"}
    await engine.upsert_pod(pod("vllm-1", uid="u1", ip="10.1.0.6", deleting=True))
    assert engine.phase("GenerationShard", NS, "a/vllm-1") is HealthPhase.DRAINING
    assert set(await published(engine, api)) == {"vllm-0"}
    await engine.delete_pod(NS, "vllm-1")
    assert engine.phase("GenerationShard", NS, "a/vllm-1") is None
    assert set(await published(engine, api)) == {"vllm-0"}
    assert api.statuses[("rolloutfleets", "a")]["healthy"] == "1/1"


async def test_pod_ips_outside_the_allowlist_are_never_probed_or_published() -> None:
    api, prober = (
        Api([pod("vllm-0", ip="10.1.0.5"), pod("evil", ip="169.254.169.254"), pod("far", ip="10.9.0.1")]),
        Prober(),
    )
    engine = engine_for(api, prober)
    await engine.prime()
    assert set(await published(engine, api)) == {"vllm-0"}
    assert set(prober.probed) == {"http://10.1.0.5:8000"}


async def test_a_restarted_operator_resumes_pod_members_from_the_fleets_persisted_healthy_set() -> None:
    """A pod listed in the persisted set with the same instance resumes Healthy (the set is not emptied); one whose
    instance changed while no operator looked starts Pending."""
    persisted = {
        "revision": "x",
        "shards": [
            {"name": "vllm-0", "endpoint": "http://10.1.0.5:8000", "instance": "u0:0"},
            {"name": "vllm-1", "endpoint": "http://10.1.0.6:8000", "instance": "u1:0"},
        ],
    }
    api = Api([pod("vllm-0", uid="u0"), pod("vllm-1", uid="u1", ip="10.1.0.6", restarts=(1,))], persisted)
    engine = engine_for(api, Prober())
    await engine.prime()
    assert engine.phase("GenerationShard", NS, "a/vllm-0") is HealthPhase.HEALTHY
    assert engine.phase("GenerationShard", NS, "a/vllm-1") is HealthPhase.PENDING


async def test_changing_the_fleets_selection_drops_members_it_no_longer_selects() -> None:
    api, prober = Api([pod("vllm-0", uid="u0"), pod("other", uid="u1", ip="10.1.0.6", labels={"app": "x"})]), Prober()
    engine = engine_for(api, prober)
    await engine.prime()
    assert set(await published(engine, api)) == {"vllm-0"}
    changed = copy.deepcopy(FLEET)
    changed["metadata"]["generation"] = 2
    changed["spec"]["shardPods"]["selector"] = {"matchLabels": {"app": "x"}}
    await engine.upsert_fleet(changed)
    assert set(await published(engine, api)) == {"other"}
    await engine.delete_fleet(NS, "a")
    assert engine.phase("GenerationShard", NS, "a/other") is None


async def test_without_pod_discovery_pods_are_not_listed() -> None:
    api = Api([pod("vllm-0")])
    listed: list[str] = []
    original = api.list_objects

    async def recording(plural: str, namespace: str | None) -> list[dict[str, Any]]:
        listed.append(plural)
        return await original(plural, namespace)

    api.list_objects = recording  # type: ignore[method-assign]
    engine = engine_for(api, Prober(), pod_discovery=False)
    await engine.prime()
    assert "pods" not in listed
    assert "endpointslices" not in listed


def endpoint_slice(name: str, endpoints: list[tuple[str, str, str, bool]]) -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes it for Service ``vllm`` (port ``http``)."""
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": "vllm"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [address],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
                "targetRef": {"kind": "Pod", "name": pod_name, "namespace": NS, "uid": uid},
            }
            for address, pod_name, uid, ready in endpoints
        ],
    }


async def test_a_services_endpoint_slices_are_a_member_source_with_pod_identity() -> None:
    api, prober = Api([pod("vllm-0", uid="u0", ip="10.1.0.5", restarts=(2,))]), Prober()
    api.fleet["spec"]["shardPods"] = {"service": "vllm", "targetPort": {"name": "http"}, "probe": PROBE}
    engine = engine_for(api, prober)
    await engine.prime()
    await engine.upsert_endpoint_slice(
        endpoint_slice("vllm-a", [("10.1.0.5", "vllm-0", "u0", True), ("10.1.0.6", "vllm-1", "u1", True)]),
    )
    assert await published(engine, api) == {"vllm-0": "u0:2", "vllm-1": "u1"}
    await engine.upsert_pod(pod("vllm-0", uid="u0", ip="10.1.0.5", restarts=(3,)))  # identity from the pod
    assert engine.instance_changes == 1
    await engine.upsert_endpoint_slice(endpoint_slice("vllm-a", [("10.1.0.5", "vllm-0", "u0", True)]))
    assert await published(engine, api) == {"vllm-0": "u0:3"}
    await engine.delete_endpoint_slice(NS, "vllm-a")
    assert await published(engine, api) == {}
