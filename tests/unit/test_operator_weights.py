"""The operator's weights decisions: Stale shards leave the healthy set, are counted, and show their identity."""

from __future__ import annotations

import dataclasses

from fleet_operator.decisions import GENERATION_SHARD, Member, fleet_status, shard_status
from fleet_operator.records import restored_state
from rollout_runtime.health import HealthPhase, HealthState, ProbeResult, ProbeSettings
from rollout_runtime.kube.api import GenerationShardSpec, RolloutFleetSpec, ShardStatus

T0 = 1_700_000_000.0
FLEET = RolloutFleetSpec.model_validate({"shardSelector": {"matchLabels": {"fleet": "a"}}, "minReadyShards": 1})
SPEC = GenerationShardSpec(endpoint="http://s:8000", model="m")


def member(name: str, phase: HealthPhase, *, version: int | None = None, stale: bool = False) -> Member:
    return Member(GENERATION_SHARD, "ns", name, {"fleet": "a"}, SPEC, "http://s:8000", phase, None, version, stale)


def refit_state() -> HealthState:
    state = HealthState(ProbeSettings(success_threshold=1))
    state.observe(ProbeResult.success(at=T0))
    state.observe_instance("uid-1:0")
    state.refit_succeeded(7)
    return state


def test_a_stale_shard_is_out_of_the_healthy_set_and_counted() -> None:
    members = [member("s1", HealthPhase.HEALTHY, version=7), member("s2", HealthPhase.STALE, stale=True)]
    status = fleet_status(FLEET, members, generation=1, previous=None, now=T0)
    assert [entry.name for entry in status.shards] == ["s1"]
    assert status.stale_shards == 1
    assert status.to_kube()["staleShards"] == 1
    assert status.healthy == "1/2"


def test_shard_status_shows_identity_weights_and_the_stale_phase() -> None:
    state = refit_state()
    healthy = shard_status(state, endpoint="http://s:1", generation=1, last_success_at=T0, previous=None, now=T0)
    assert (healthy.instance, healthy.weights_version, healthy.phase) == ("uid-1:0", 7, HealthPhase.HEALTHY)
    state.observe_instance("uid-1:1")  # the container restarted
    stale = shard_status(state, endpoint="http://s:1", generation=1, last_success_at=T0, previous=healthy, now=T0)
    assert stale.phase is HealthPhase.STALE
    assert stale.weights_version is None
    assert stale.instance == "uid-1:1"
    ready = stale.conditions[0]
    assert (ready.status, ready.reason) == ("False", "Stale")
    assert "no traffic until the trainer refits it" in ready.message


def test_a_restarted_operator_resumes_stale_and_remembers_the_refit_instance() -> None:
    state = refit_state()
    persisted = shard_status(state, endpoint="http://s:1", generation=1, last_success_at=T0, previous=None, now=T0)
    resumed = restored_state(SPEC, persisted.to_kube())
    assert resumed is not None
    assert resumed.weights_version == 7
    assert resumed.observe_instance("uid-2:0") is not None, "a new pod after the operator restart must be Stale"
    stale = dataclasses.replace(member("s", HealthPhase.STALE), stale=True)
    assert fleet_status(FLEET, [stale], generation=1, previous=None, now=T0).stale_shards == 1
    persisted_stale = ShardStatus(phase=HealthPhase.STALE, instance="uid-2:0").to_kube()
    again = restored_state(SPEC, persisted_stale)
    assert again is not None
    assert again.phase is HealthPhase.STALE
