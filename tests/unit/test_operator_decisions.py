"""Pure reconciliation decisions: selection, healthy set, revision, conditions, and when a status is written."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fleet_operator.conditions import rfc3339, set_condition
from fleet_operator.decisions import (
    ENVIRONMENT_SERVER,
    FLEET_VOLATILE_KEYS,
    GENERATION_SHARD,
    SHARD_VOLATILE_KEYS,
    Member,
    fleet_status,
    resolve_endpoint,
    selector_matches,
    shard_status,
    status_needs_write,
)
from rollout_runtime.health import HealthPhase, HealthState, ProbeReason, ProbeResult, ProbeSettings
from rollout_runtime.kube.api import (
    EnvironmentServerSpec,
    GenerationShardSpec,
    LabelSelector,
    RolloutFleetSpec,
)
from rollout_runtime.shards import HealthySet, Shard

T0 = 1_700_000_000.0
FLEET = RolloutFleetSpec.model_validate(
    {
        "shardSelector": {"matchLabels": {"fleet": "a"}},
        "environmentServerSelector": {"matchLabels": {"fleet": "a"}},
        "minReadyShards": 2,
    }
)


def shard(name: str, phase: HealthPhase, *, labels: dict[str, str] | None = None, weight: float = 1.0) -> Member:
    spec = GenerationShardSpec(endpoint=f"http://{name}:8000", model="m", max_model_len=4096, weight=weight)
    return Member(GENERATION_SHARD, "ns", name, labels or {"fleet": "a"}, spec, spec.endpoint or "", phase)


def env(name: str, phase: HealthPhase) -> Member:
    spec = EnvironmentServerSpec(endpoint=f"http://{name}:9000", protocol="verifier")
    return Member(ENVIRONMENT_SERVER, "ns", name, {"fleet": "a"}, spec, spec.endpoint or "", phase)


def test_service_ref_resolves_to_the_cluster_dns_name_in_the_objects_namespace() -> None:
    spec = GenerationShardSpec.model_validate({"serviceRef": {"name": "vllm", "port": 8001}})
    assert resolve_endpoint(spec, "team-a", "cluster.local") == "http://vllm.team-a.svc.cluster.local:8001"
    assert resolve_endpoint(GenerationShardSpec(endpoint="http://10.1.2.3:80/"), "x", "c") == "http://10.1.2.3:80"


def test_selector_semantics_follow_metav1() -> None:
    selector = LabelSelector.model_validate(
        {
            "matchLabels": {"fleet": "a"},
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["x", "y"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "tier", "operator": "NotIn", "values": ["bad"]},
                {"key": "gpu", "operator": "Exists"},
            ],
        }
    )
    assert selector_matches(selector, {"fleet": "a", "zone": "x", "gpu": "h100"})
    assert not selector_matches(selector, {"fleet": "a", "zone": "z", "gpu": "h100"})
    assert not selector_matches(selector, {"fleet": "a", "zone": "x", "gpu": "h100", "canary": "1"})
    assert not selector_matches(selector, {"fleet": "a", "zone": "x", "gpu": "h100", "tier": "bad"})
    assert not selector_matches(selector, {"fleet": "a", "zone": "x"})


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=5))
def test_an_empty_selector_selects_every_object(labels: dict[str, str]) -> None:
    """Invariant: metav1 semantics, an empty LabelSelector matches any label set."""
    assert selector_matches(LabelSelector(), labels)


def test_healthy_set_holds_only_serving_selected_shards_sorted_with_runtime_fields() -> None:
    members = [
        shard("s2", HealthPhase.SUSPECT),
        shard("s1", HealthPhase.HEALTHY, weight=2.0),
        shard("s3", HealthPhase.UNHEALTHY),
        shard("s4", HealthPhase.DRAINING),
        shard("s5", HealthPhase.HEALTHY, labels={"fleet": "b"}),
        env("e1", HealthPhase.HEALTHY),
    ]
    status = fleet_status(FLEET, members, generation=3, previous=None, now=T0)
    assert [e.name for e in status.shards] == ["s1", "s2"]
    assert status.shards[0].to_kube() == {
        "name": "s1",
        "endpoint": "http://s1:8000",
        "model": "m",
        "maxModelLen": 4096,
        "weight": 2.0,
    }
    assert (status.ready_shards, status.total_shards, status.healthy) == (2, 4, "2/4")
    assert (status.ready_environment_servers, status.total_environment_servers) == (1, 1)
    assert [e.name for e in status.environment_servers] == ["e1"]
    assert status.observed_generation == 3


def test_fleet_revision_without_environments_equals_the_runtimes_healthy_set_revision() -> None:
    fleet = RolloutFleetSpec.model_validate({"shardSelector": {}})
    status = fleet_status(fleet, [shard("s1", HealthPhase.HEALTHY)], generation=1, previous=None, now=T0)
    runtime_view = HealthySet.of([Shard(name="s1", endpoint="http://s1:8000", model="m", max_model_len=4096)])
    assert status.revision == runtime_view.revision


def test_revision_changes_exactly_when_the_healthy_set_changes() -> None:
    base = [shard("s1", HealthPhase.HEALTHY), shard("s2", HealthPhase.HEALTHY), env("e1", HealthPhase.HEALTHY)]
    r0 = fleet_status(FLEET, base, generation=1, previous=None, now=T0).revision
    same_set = [shard("s1", HealthPhase.SUSPECT), shard("s2", HealthPhase.HEALTHY), env("e1", HealthPhase.HEALTHY)]
    assert fleet_status(FLEET, same_set, generation=1, previous=None, now=T0 + 60).revision == r0
    fewer = [shard("s1", HealthPhase.UNHEALTHY), shard("s2", HealthPhase.HEALTHY), env("e1", HealthPhase.HEALTHY)]
    assert fleet_status(FLEET, fewer, generation=1, previous=None, now=T0).revision != r0
    env_gone = [shard("s1", HealthPhase.HEALTHY), shard("s2", HealthPhase.HEALTHY), env("e1", HealthPhase.UNHEALTHY)]
    assert fleet_status(FLEET, env_gone, generation=1, previous=None, now=T0).revision != r0


def conditions_by_type(status: Any) -> dict[str, Any]:
    return {c.type: c for c in status.conditions}


def test_ready_and_degraded_conditions_follow_min_ready_and_sick_members() -> None:
    two_healthy = [shard("s1", HealthPhase.HEALTHY), shard("s2", HealthPhase.HEALTHY), shard("s3", HealthPhase.PENDING)]
    conditions = conditions_by_type(fleet_status(FLEET, two_healthy, generation=1, previous=None, now=T0))
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("True", "EnoughHealthyShards")
    assert conditions["Degraded"].status == "True"
    assert "GenerationShard/s3 (Pending)" in conditions["Degraded"].message
    one_healthy = [shard("s1", HealthPhase.HEALTHY), shard("s2", HealthPhase.UNHEALTHY)]
    conditions = conditions_by_type(fleet_status(FLEET, one_healthy, generation=1, previous=None, now=T0))
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("False", "NotEnoughHealthyShards")
    assert conditions["Ready"].message == "1 of 2 shards healthy; minReadyShards is 2"


def test_condition_transition_time_moves_only_when_status_flips() -> None:
    first = set_condition([], "Ready", "True", "Healthy", "a", now=T0, observed_generation=1)
    same = set_condition(first, "Ready", "True", "Suspect", "b", now=T0 + 100, observed_generation=2)
    assert same[0].last_transition_time == rfc3339(T0)
    assert (same[0].reason, same[0].message, same[0].observed_generation) == ("Suspect", "b", 2)
    flipped = set_condition(same, "Ready", "False", "Unhealthy", "c", now=T0 + 200)
    assert flipped[0].last_transition_time == rfc3339(T0 + 200)
    assert rfc3339(T0) == "2023-11-14T22:13:20Z"


def test_fleet_conditions_keep_their_transition_time_across_recomputations() -> None:
    members = [shard("s1", HealthPhase.HEALTHY), shard("s2", HealthPhase.HEALTHY)]
    first = fleet_status(FLEET, members, generation=1, previous=None, now=T0)
    later = fleet_status(FLEET, members, generation=1, previous=first, now=T0 + 500)
    assert conditions_by_type(later)["Ready"].last_transition_time == rfc3339(T0)
    assert later.last_heartbeat_time == rfc3339(T0 + 500)


def probe_state(*results: ProbeResult) -> HealthState:
    state = HealthState(ProbeSettings(failure_threshold=2, success_threshold=1, period_seconds=1, timeout_seconds=0.5))
    for result in results:
        state.observe(result)
    return state


def test_shard_status_reports_phase_counts_latency_and_a_ready_condition() -> None:
    state = probe_state(
        ProbeResult.success(latency_seconds=0.0123, at=T0),
        ProbeResult.failure(ProbeReason.TIMEOUT, "no answer within 0.5 s", latency_seconds=0.5, at=T0 + 1),
    )
    status = shard_status(state, endpoint="http://s:1", generation=4, last_success_at=T0, previous=None, now=T0 + 1)
    assert status.phase is HealthPhase.SUSPECT
    assert (status.consecutive_failures, status.consecutive_successes) == (1, 0)
    assert status.last_error == "timeout: no answer within 0.5 s"
    assert status.latency_milliseconds == 500.0
    assert status.last_success_time == rfc3339(T0)
    ready = status.conditions[0]
    assert (ready.type, ready.status, ready.reason, ready.observed_generation) == ("Ready", "True", "Suspect", 4)


def test_a_probe_that_only_moves_volatile_fields_is_not_written_before_the_heartbeat() -> None:
    ok = ProbeResult.success(latency_seconds=0.01, at=T0)
    one = shard_status(probe_state(ok), endpoint="http://s:1", generation=1, last_success_at=T0, previous=None, now=T0)
    two = shard_status(
        probe_state(ok, ProbeResult.success(latency_seconds=0.02, at=T0 + 5)),
        endpoint="http://s:1",
        generation=1,
        last_success_at=T0 + 5,
        previous=one,
        now=T0 + 5,
    )
    written, desired = one.to_kube(), two.to_kube()
    assert desired != written
    assert not status_needs_write(written, desired, SHARD_VOLATILE_KEYS, heartbeat_due=False)
    assert status_needs_write(written, desired, SHARD_VOLATILE_KEYS, heartbeat_due=True)
    assert not status_needs_write(written, written, SHARD_VOLATILE_KEYS, heartbeat_due=True)


def test_a_phase_change_is_written_at_once() -> None:
    ok = ProbeResult.success(at=T0)
    bad = ProbeResult.failure(ProbeReason.CONNECT, "refused", at=T0 + 1)
    before = shard_status(
        probe_state(ok), endpoint="http://s:1", generation=1, last_success_at=T0, previous=None, now=T0
    )
    after = shard_status(
        probe_state(ok, bad, bad), endpoint="http://s:1", generation=1, last_success_at=T0, previous=before, now=T0 + 2
    )
    assert after.phase is HealthPhase.UNHEALTHY
    assert status_needs_write(before.to_kube(), after.to_kube(), SHARD_VOLATILE_KEYS, heartbeat_due=False)


def test_a_fleet_heartbeat_alone_waits_for_the_heartbeat_interval() -> None:
    members = [shard("s1", HealthPhase.HEALTHY)]
    first_status = fleet_status(FLEET, members, generation=1, previous=None, now=T0)
    first = first_status.to_kube()
    later = fleet_status(FLEET, members, generation=1, previous=first_status, now=T0 + 7).to_kube()
    assert not status_needs_write(first, later, FLEET_VOLATILE_KEYS, heartbeat_due=False)
    assert status_needs_write(first, later, FLEET_VOLATILE_KEYS, heartbeat_due=True)
