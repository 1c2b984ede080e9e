"""Contracts between the operator and the runtime: policy names, the healthy set the runtime reads, leader
election decisions, settings from the environment, and the status table."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from rich.console import Console

from fleet_operator.crds import ROLLOUT_FLEET, render_crd
from fleet_operator.decisions import ENVIRONMENT_SERVER, GENERATION_SHARD, Member, fleet_status
from fleet_operator.leader import LeaseAction, LeaseRecord, decide
from fleet_operator.settings import OperatorSettings
from fleet_operator.status_table import fleet_table
from rollout_runtime.dispatch import DispatchPolicy
from rollout_runtime.health import HealthPhase
from rollout_runtime.kube.api import (
    EnvironmentServerSpec,
    GenerationShardSpec,
    RolloutFleetSpec,
    RolloutFleetStatus,
    read_fleet_status,
)
from rollout_runtime.shards.kubernetes import KubernetesShardSource, healthy_set_from_status


def _crd_policy() -> dict[str, Any]:
    """``spec.policy`` of the RolloutFleet CRD: its schema, with the default the API server fills in."""
    schema: dict[str, Any] = render_crd(ROLLOUT_FLEET)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]["properties"]["policy"]


def test_the_runtime_reads_every_policy_field_the_crd_stores() -> None:
    schema = _crd_policy()
    stored = {**schema["default"], "maxConcurrency": 4, "hedgeFactor": 3}
    assert set(stored) == set(schema["properties"])
    policy = DispatchPolicy.from_fleet(stored)
    assert policy == DispatchPolicy(attempt_timeout_seconds=300, max_concurrency=4, hedge_factor=3)


async def test_the_shard_source_reads_the_fleet_policy_and_refuses_fields_it_does_not_know() -> None:
    source = KubernetesShardSource("a", "ns")
    source.fleet_object = {"spec": {"policy": {**_crd_policy()["default"], "maxInfraAttempts": 3}}}
    policy = await source.dispatch_policy(max_concurrency=2)
    assert (policy.max_infra_attempts, policy.max_concurrency, policy.attempt_timeout_seconds) == (3, 2, 300)
    source.fleet_object = {"spec": {"policy": {"maxInfraAttempts": 3, "maxRetries": 9}}}
    with pytest.raises(ValueError, match="does not know: maxRetries"):
        await source.dispatch_policy()


def test_the_runtime_reads_the_healthy_set_the_operator_publishes() -> None:
    spec = GenerationShardSpec(endpoint="http://10.0.0.5:8000", model="m", max_model_len=1024, weight=3)
    member = Member(GENERATION_SHARD, "ns", "s1", {}, spec, "http://10.0.0.5:8000", HealthPhase.HEALTHY, 1.7e9)
    status = fleet_status(
        RolloutFleetSpec.model_validate({"shardSelector": {}}), [member], generation=1, previous=None, now=1.7e9
    )
    snapshot = healthy_set_from_status(status.to_kube())
    assert snapshot.revision == status.revision
    (shard,) = snapshot.shards
    assert (shard.name, shard.endpoint, shard.model, shard.max_model_len, shard.weight) == (
        "s1",
        "http://10.0.0.5:8000",
        "m",
        1024,
        3.0,
    )
    assert snapshot.probe_ok_at == {"s1": 1.7e9}


def test_a_status_without_revision_still_gives_a_stable_revision() -> None:
    shards = [{"name": "s1", "endpoint": "http://a:1"}, {"name": "bad", "endpoint": "not a url"}]
    first, second = healthy_set_from_status({"shards": shards}), healthy_set_from_status({"shards": shards})
    assert first.revision == second.revision
    assert first.names() == frozenset({"s1"}), "an unparseable entry is skipped, not fatal"


def test_a_reader_keeps_what_parses_of_a_fleet_status_and_drops_the_rest() -> None:
    status = read_fleet_status(
        {
            "revision": "r1",
            "policyVersion": "not a version",
            "shards": [{"name": "s1", "endpoint": "http://a:1"}, {"endpoint": "http://nameless:1"}, "garbage"],
            "shardWeights": [{"name": "s1", "weightsVersion": 2}, {"name": "s2", "weightsVersion": -1}],
            "conditions": [{"type": "Ready"}],
            "fieldOfALaterRelease": 1,
        }
    )
    assert (status.revision, status.policy_version, status.conditions) == ("r1", None, [])
    assert [e.name for e in status.shards] == ["s1"]
    assert [(e.name, e.weights_version) for e in status.shard_weights] == [("s1", 2)]
    assert read_fleet_status(None) == RolloutFleetStatus()


def test_the_runtime_reads_the_fleet_status_with_the_operators_model_and_never_imports_the_operator() -> None:
    code = (
        "import sys\n"
        "import rollout_runtime.kube.api, rollout_runtime.shards.kubernetes\n"
        "import rollout_runtime.shards.kubernetes_weights\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'fleet_operator'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("record", "unchanged_for", "action"),
    [
        (None, 0.0, LeaseAction.CREATE),
        (LeaseRecord("me", "7", 15), 100.0, LeaseAction.RENEW),
        (LeaseRecord("other", "7", 15), 14.9, LeaseAction.WAIT),
        (LeaseRecord("other", "7", 15), 15.0, LeaseAction.TAKE),
        (LeaseRecord(None, "7", 15), 0.0, LeaseAction.TAKE),
    ],
)
def test_leader_election_decides_from_the_lease_and_our_own_clock(
    record: LeaseRecord | None, unchanged_for: float, action: LeaseAction
) -> None:
    assert decide(record, "me", unchanged_for=unchanged_for) is action


def test_settings_read_lists_as_json_or_commas_and_build_the_probe_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_OPERATOR_PROBE_ALLOWED_HOSTS", "*.gpu.internal, 10.0.0.0/8")
    monkeypatch.setenv("FLEET_OPERATOR_NAMESPACES", '["a", "b"]')
    settings = OperatorSettings()
    assert settings.namespaces == ["a", "b"]
    policy = settings.probe_policy()
    assert policy.check("http://node-3.gpu.internal:8000/health").allowed
    assert policy.check("http://10.2.3.4:8000/health").allowed
    assert policy.check("http://vllm.team.svc.cluster.local:8000/health").allowed
    assert not policy.check("http://example.com/health").allowed
    assert not policy.check("http://127.0.0.1:8000/health").allowed
    assert not policy.check("http://169.254.169.254/latest").allowed


def test_settings_reject_a_bad_allowlist_and_lease_timing() -> None:
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        OperatorSettings(probe_allowed_hosts=["10.0.0.0/99"])
    with pytest.raises(ValueError, match="lease_renew_seconds must be less"):
        OperatorSettings(lease_duration_seconds=5, lease_renew_seconds=5)


def test_status_table_lists_selected_members_with_phase_and_set_membership() -> None:
    fleet = {
        "metadata": {"name": "a"},
        "spec": {"shardSelector": {"matchLabels": {"fleet": "a"}}},
        "status": {"healthy": "1/2", "revision": "abc", "shards": [{"name": "s1", "endpoint": "http://x:1"}]},
    }
    shards = [
        {
            "metadata": {"name": "s1", "labels": {"fleet": "a"}},
            "status": {"phase": "Healthy", "latencyMilliseconds": 3.2},
        },
        {
            "metadata": {"name": "s2", "labels": {"fleet": "a"}},
            "status": {"phase": "Unhealthy", "lastError": "timeout"},
        },
        {"metadata": {"name": "other", "labels": {"fleet": "b"}}, "status": {"phase": "Healthy"}},
    ]
    console = Console(width=200, record=True)
    console.print(fleet_table(fleet, shards, []))
    text = console.export_text()
    assert "healthy 1/2" in text
    assert "revision abc" in text
    rows = {line.split("│")[2].strip(): line for line in text.splitlines() if line.startswith("│")}
    assert set(rows) == {"s1", "s2"}, "the other fleet's shard is not listed"
    assert "Healthy" in rows["s1"]
    assert "yes" in rows["s1"]
    assert "3.2" in rows["s1"]
    assert "Unhealthy" in rows["s2"]
    assert "no" in rows["s2"]
    assert "timeout" in rows["s2"]


def test_the_runtime_reads_the_environment_servers_the_operator_publishes_apart_from_the_shards() -> None:
    shard = Member(
        GENERATION_SHARD, "ns", "s1", {}, GenerationShardSpec(endpoint="http://10.0.0.5:8000"),
        "http://10.0.0.5:8000", HealthPhase.HEALTHY, 1.7e9,
    )  # fmt: skip
    env_spec = EnvironmentServerSpec(endpoint="http://10.0.0.9:9000", weight=2)
    env = Member(ENVIRONMENT_SERVER, "ns", "env-1", {}, env_spec, "http://10.0.0.9:9000", HealthPhase.HEALTHY, 1.7e9)
    fleet = RolloutFleetSpec.model_validate({"shardSelector": {}, "environmentServerSelector": {}})
    status = fleet_status(fleet, [shard, env], generation=1, previous=None, now=1.7e9).to_kube()

    servers = healthy_set_from_status(status, "environmentServers")
    shards = healthy_set_from_status(status)

    assert [(s.name, s.endpoint, s.weight) for s in servers.shards] == [("env-1", "http://10.0.0.9:9000", 2.0)]
    assert [s.name for s in shards.shards] == ["s1"]
    assert KubernetesShardSource("a", "ns", members="environmentServers").members == "environmentServers"
