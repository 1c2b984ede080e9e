"""What the operator's Kubernetes Events say, pure: a target's phase changes and a fleet's readiness flips."""

from __future__ import annotations

from fleet_operator.decisions import GENERATION_SHARD, Member, fleet_status, readiness_event, transition_event
from rollout_runtime.health import HealthPhase, Transition
from rollout_runtime.kube.api import GenerationShardSpec, RolloutFleetSpec, RolloutFleetStatus

FLEET = RolloutFleetSpec.model_validate({"shardSelector": {}, "minReadyShards": 1})


def fleet_with(phase: HealthPhase) -> RolloutFleetStatus:
    spec = GenerationShardSpec(endpoint="http://s0:8000", model="m")
    member = Member(GENERATION_SHARD, "ns", "s0", {}, spec, "http://s0:8000", phase)
    return fleet_status(FLEET, [member], generation=1, previous=None, now=1_700_000_000.0)


def test_a_target_that_starts_failing_gets_a_warning_with_the_cause() -> None:
    note = transition_event(Transition(from_phase=HealthPhase.HEALTHY, to_phase=HealthPhase.SUSPECT, reason="timeout"))
    assert (note.type_, note.reason, note.message) == ("Warning", "BecameSuspect", "Healthy -> Suspect (timeout)")
    failed = Transition(
        from_phase=HealthPhase.SUSPECT, to_phase=HealthPhase.UNHEALTHY, reason="connect", message="refused"
    )
    assert transition_event(failed).message == "Suspect -> Unhealthy (connect): refused"
    assert transition_event(failed).type_ == "Warning"


def test_recovering_and_draining_are_normal_events() -> None:
    for to_phase in (HealthPhase.HEALTHY, HealthPhase.DRAINING, HealthPhase.PENDING):
        note = transition_event(Transition(from_phase=HealthPhase.UNHEALTHY, to_phase=to_phase, reason="drain"))
        assert (note.type_, note.reason) == ("Normal", f"Became{to_phase.value}")


def test_a_fleet_event_is_posted_only_when_its_ready_condition_flips() -> None:
    ready, not_ready = fleet_with(HealthPhase.HEALTHY), fleet_with(HealthPhase.UNHEALTHY)
    assert readiness_event(ready, fleet_with(HealthPhase.SUSPECT)) is None
    down = readiness_event(ready, not_ready)
    assert down is not None
    assert (down.type_, down.reason, down.message) == (
        "Warning",
        "FleetNotReady",
        f"0/1 shards healthy (revision {not_ready.revision})",
    )
    up = readiness_event(not_ready, ready)
    assert up is not None
    assert (up.type_, up.reason) == ("Normal", "FleetReady")
    first = readiness_event(None, ready)
    assert first is not None, "a fleet's first write announces its readiness"
    assert first.reason == "FleetReady"
