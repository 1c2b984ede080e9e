"""Records from watch events, pure: what an event body says, what an update changed, what the monitor is given."""

from __future__ import annotations

from typing import Any

from fleet_operator.decisions import ENVIRONMENT_SERVER, GENERATION_SHARD, ROLLOUT_FLEET
from fleet_operator.records import (
    FleetKey,
    Records,
    TargetKey,
    observe_fleet,
    observe_target,
    restored_state,
)
from rollout_runtime.health import HealthPhase, HealthState, ProbeSettings

NS = "team-a"
DOMAIN = "cluster.local"


def shard_body(name: str, *, uid: str = "u1", labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid, "generation": 3, "labels": labels or {"fleet": "a"}},
        "spec": {"endpoint": f"http://{name}:8000", "model": "m", **spec},
    }


def fleet_body(*, uid: str = "f1", generation: int = 1, min_ready: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "a", "namespace": NS, "uid": uid, "generation": generation},
        "spec": {"shardSelector": {"matchLabels": {"fleet": "a"}}, "minReadyShards": min_ready},
    }


def test_a_target_key_names_kind_namespace_and_object() -> None:
    key = TargetKey(GENERATION_SHARD, NS, "s0")
    assert (key.kind, key.namespace, key.name) == (GENERATION_SHARD, NS, "s0")
    assert str(key) == "GenerationShard/team-a/s0"


def test_an_event_body_becomes_a_typed_observation() -> None:
    body = {
        "metadata": {"name": "env", "namespace": NS, "uid": "u9", "generation": 2},
        "spec": {"serviceRef": {"name": "verifier", "port": 9000}, "protocol": "verifier"},
        "status": {"phase": "Healthy"},
    }
    seen = observe_target(ENVIRONMENT_SERVER, body, DOMAIN)
    assert seen.key == TargetKey(ENVIRONMENT_SERVER, NS, "env")
    assert (seen.uid, seen.generation, seen.labels, seen.invalid) == ("u9", 2, {}, None)
    assert seen.endpoint == "http://verifier.team-a.svc.cluster.local:9000"
    assert seen.status == {"phase": "Healthy"}


def test_an_invalid_spec_is_recorded_with_the_reason_and_never_probed() -> None:
    seen = observe_target(GENERATION_SHARD, shard_body("s0", weight=-1), DOMAIN)
    assert seen.spec is None
    assert seen.endpoint == ""
    assert seen.invalid is not None
    assert seen.invalid.startswith("invalid spec: ")
    records = Records()
    records.update_target(seen, now=0.0)
    assert records.probe_targets() == []
    fleet = observe_fleet({"metadata": {"name": "a", "namespace": NS}, "spec": {"minReadyShards": -3}})
    assert fleet.spec is None
    assert fleet.invalid is not None
    assert fleet.invalid.startswith("invalid spec: ")


def test_a_new_target_resumes_from_its_persisted_status() -> None:
    records = Records()
    body = {**shard_body("s0"), "status": {"phase": "Healthy", "lastError": None}}
    update = records.update_target(observe_target(GENERATION_SHARD, body, DOMAIN), now=7.0)
    assert update.probe_changed
    assert update.previous_spec is None
    assert (update.record.write.written, update.record.write.written_at) == ({"phase": "Healthy"}, 7.0)
    assert records.targets[TargetKey(GENERATION_SHARD, NS, "s0")] is update.record


def test_an_update_says_what_changed() -> None:
    records = Records()
    records.update_target(observe_target(GENERATION_SHARD, shard_body("s0"), DOMAIN), now=0.0)
    same = records.update_target(observe_target(GENERATION_SHARD, shard_body("s0"), DOMAIN), now=1.0)
    assert not same.probe_changed
    assert not same.labels_changed
    relabelled = records.update_target(
        observe_target(GENERATION_SHARD, shard_body("s0", labels={"fleet": "b"}), DOMAIN), now=2.0
    )
    assert relabelled.labels_changed
    assert not relabelled.probe_changed
    assert relabelled.record.labels == {"fleet": "b"}
    moved = records.update_target(
        observe_target(GENERATION_SHARD, shard_body("s0", endpoint="http://elsewhere:8000"), DOMAIN), now=3.0
    )
    assert moved.probe_changed
    assert moved.previous_spec is not None
    assert moved.previous_spec.endpoint == "http://s0:8000"
    assert moved.record.endpoint == "http://elsewhere:8000"


def test_an_object_known_under_another_uid_was_replaced() -> None:
    records = Records()
    records.update_target(observe_target(GENERATION_SHARD, shard_body("s0", uid="u1"), DOMAIN), now=0.0)
    records.update_fleet(observe_fleet(fleet_body(uid="f1")), now=0.0)
    assert not records.replaced(observe_target(GENERATION_SHARD, shard_body("s0", uid="u1"), DOMAIN))
    assert records.replaced(observe_target(GENERATION_SHARD, shard_body("s0", uid="u2"), DOMAIN))
    assert not records.replaced(observe_target(GENERATION_SHARD, shard_body("s1", uid="u2"), DOMAIN))
    assert records.replaced(observe_fleet(fleet_body(uid="f2")))


def test_a_fleet_is_dirtied_by_its_first_unwritten_change_only() -> None:
    records = Records()
    fleet = records.update_fleet(observe_fleet(fleet_body()), now=10.0)
    assert fleet.kind == ROLLOUT_FLEET
    assert fleet.dirty_since == 10.0
    fleet.dirty_since = None  # written
    records.update_fleet(observe_fleet(fleet_body()), now=11.0)
    assert fleet.dirty_since is None, "the same spec and generation again is no change"
    records.update_fleet(observe_fleet(fleet_body(generation=2, min_ready=2)), now=12.0)
    records.update_fleet(observe_fleet(fleet_body(generation=3, min_ready=3)), now=13.0)
    assert fleet.dirty_since == 12.0, "the coalescing window opens at the first change"
    assert records.fleets[FleetKey(NS, "a")] is fleet


def test_member_changes_dirty_the_fleets_of_their_namespace_only() -> None:
    records = Records()
    here = records.update_fleet(observe_fleet(fleet_body()), now=0.0)
    there = records.update_fleet(
        observe_fleet({"metadata": {"name": "b", "namespace": "other", "uid": "f9"}, "spec": {}}), now=0.0
    )
    here.dirty_since = there.dirty_since = None
    records.dirty_fleets(NS, now=5.0)
    records.dirty_fleets(NS, now=6.0)
    assert (here.dirty_since, there.dirty_since) == (5.0, None)


def test_the_probe_list_names_targets_by_key_and_expects_the_shards_model() -> None:
    records = Records()
    records.update_target(observe_target(GENERATION_SHARD, shard_body("s0"), DOMAIN), now=0.0)
    env = {"metadata": {"name": "e0", "namespace": NS, "uid": "u2"}, "spec": {"endpoint": "http://e0:9000"}}
    records.update_target(observe_target(ENVIRONMENT_SERVER, env, DOMAIN), now=0.0)
    targets = {t.name: t for t in records.probe_targets()}
    assert set(targets) == {TargetKey(GENERATION_SHARD, NS, "s0"), TargetKey(ENVIRONMENT_SERVER, NS, "e0")}
    assert targets[TargetKey(GENERATION_SHARD, NS, "s0")].expected_model == "m"
    assert targets[TargetKey(ENVIRONMENT_SERVER, NS, "e0")].expected_model is None
    assert targets[TargetKey(GENERATION_SHARD, NS, "s0")].endpoint == "http://s0:8000"


def test_a_persisted_phase_and_counts_are_restored_and_pending_starts_fresh() -> None:
    records = Records()
    seen = observe_target(GENERATION_SHARD, shard_body("s0", drain=True), DOMAIN)
    records.update_target(seen, now=0.0)
    assert seen.spec is not None
    suspect = {"phase": "Suspect", "consecutiveSuccesses": 0, "consecutiveFailures": 1, "lastError": "timeout: slow"}
    state = restored_state(seen.spec, suspect)
    assert state is not None
    assert (state.phase, state.consecutive_failures, state.last_error) == (HealthPhase.DRAINING, 1, "timeout: slow")
    assert restored_state(seen.spec, {"phase": "Pending"}) is None
    assert restored_state(seen.spec, {"phase": "NotAPhase"}) is None
    key = seen.key
    assert set(records.restored_states({key: suspect}, skip=())) == {key}
    assert records.restored_states({key: suspect}, skip={key}) == {}
    assert records.restored_states({TargetKey(GENERATION_SHARD, NS, "gone"): suspect}, skip=()) == {}


def test_members_carry_their_health_and_default_to_pending() -> None:
    records = Records()
    for name in ("s0", "s1"):
        records.update_target(observe_target(GENERATION_SHARD, shard_body(name), DOMAIN), now=0.0)
    elsewhere = {**shard_body("s2"), "metadata": {"name": "s2", "namespace": "other", "uid": "u3"}}
    records.update_target(observe_target(GENERATION_SHARD, elsewhere, DOMAIN), now=0.0)
    s0 = TargetKey(GENERATION_SHARD, NS, "s0")
    healthy = HealthState.restore(ProbeSettings(), HealthPhase.HEALTHY)
    members = {m.name: m for m in records.members(NS, {s0: healthy}, {s0: 1_700_000_000.0})}
    assert set(members) == {"s0", "s1"}
    assert (members["s0"].phase, members["s0"].last_success_at) == (HealthPhase.HEALTHY, 1_700_000_000.0)
    assert (members["s1"].phase, members["s1"].last_success_at) == (HealthPhase.PENDING, None)
    assert members["s0"].endpoint == "http://s0:8000"
