"""The trainer's PolicyVersion, decided on by the operator: new refits applied once, replays never lift a Stale
shard, lagging shards found, invalid objects refused by both layers, and the fleet status publishes the weights."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleet_operator.crds import POLICY_VERSION, render_crd
from fleet_operator.decisions import GENERATION_SHARD, Member, fleet_status
from fleet_operator.weights import lagging, observe_policy, refit_targets, refits_to_apply
from rollout_runtime.health import HealthPhase, HealthState, ProbeResult, ProbeSettings
from rollout_runtime.kube.api import GenerationShardSpec, PolicyVersionSpec, RefitRecord, RolloutFleetSpec

T0 = 1_700_000_000.0
SPEC = GenerationShardSpec(endpoint="http://s:8000", model="m")


def fleet(max_lag: int = 0) -> RolloutFleetSpec:
    return RolloutFleetSpec.model_validate(
        {"shardSelector": {"matchLabels": {"fleet": "a"}}, "policy": {"maxWeightsLag": max_lag}}
    )


def member(name: str, version: int | None, *, labels: dict[str, str] | None = None, stale: bool = False) -> Member:
    phase = HealthPhase.STALE if stale else HealthPhase.HEALTHY
    labels = {"fleet": "a"} if labels is None else labels
    return Member(GENERATION_SHARD, "ns", name, labels, SPEC, "http://s:8000", phase, None, version, stale)


def state(*, instance: str, version: int | None = 1, stale: bool = False) -> HealthState:
    s = HealthState(ProbeSettings(success_threshold=1))
    s.observe(ProbeResult.success(at=T0))
    s.observe_instance(instance)
    if version is not None:
        s.refit_succeeded(version)
    if stale:
        s.mark_stale("restarted")
    return s


def test_a_new_refit_is_applied_once() -> None:
    refit = RefitRecord(shard="s0", version=2, instance="w:2")
    states = {"s0": state(instance="w:1")}
    assert refits_to_apply([refit], {}, states, first_sighting=False) == ([refit], [])
    assert refits_to_apply([refit], {"s0": refit}, states, first_sighting=False) == ([], [])


def test_a_replayed_refit_of_an_earlier_instance_does_not_lift_a_stale_shard() -> None:
    """After an operator restart the whole object is re-listed: the refit of the instance that crashed is not
    evidence for the one running now."""
    old = RefitRecord(shard="s0", version=1, instance="uid:0")
    states = {"s0": state(instance="uid:1", version=None, stale=True)}
    assert refits_to_apply([old], {}, states, first_sighting=True) == ([], [old])
    without_instance = RefitRecord(shard="s0", version=1)
    assert refits_to_apply([without_instance], {}, states, first_sighting=True) == ([], [without_instance])


def test_on_first_sighting_a_refit_of_the_running_instance_lifts_it() -> None:
    current = RefitRecord(shard="s0", version=1, instance="uid:1")
    states = {"s0": state(instance="uid:1", version=None, stale=True)}
    assert refits_to_apply([current], {}, states, first_sighting=True) == ([current], [])


def test_a_refit_of_an_unknown_shard_waits_for_the_shard() -> None:
    refit = RefitRecord(shard="later", version=1)
    assert refits_to_apply([refit], {}, {}, first_sighting=False) == ([], [])


def test_refits_name_pod_members_by_their_pod_and_never_another_fleets_members() -> None:
    """A trainer refits under the names fleet a's status publishes: its GenerationShards' and its pods'."""
    targets = ["s0", "a/vllm-0", "b/vllm-1", "a/s0"]
    assert refit_targets("a", targets) == {"s0": "s0", "vllm-0": "a/vllm-0"}, "the object wins a shared name"


def test_lagging_shards_are_those_beyond_max_weights_lag_in_the_fleet() -> None:
    members = [
        member("on-policy", 5),
        member("one-behind", 4),
        member("far-behind", 2),
        member("never-refit", None),
        member("other-fleet", 0, labels={"fleet": "b"}),
    ]
    assert lagging(fleet(0), members, 5, "fleet-a") == ["far-behind", "one-behind"]
    assert lagging(fleet(1), members, 5, "fleet-a") == ["far-behind"]


def test_both_layers_refuse_a_refit_ahead_of_the_policy_version() -> None:
    body = {"policyVersion": 1, "refits": [{"shard": "s0", "version": 2}]}
    with pytest.raises(ValidationError, match="must not be ahead of policyVersion"):
        PolicyVersionSpec.model_validate(body)
    seen = observe_policy({"metadata": {"namespace": "ns", "name": "a", "uid": "u"}, "spec": body})
    assert seen.spec is None
    assert seen.invalid is not None
    assert "ahead of policyVersion" in seen.invalid

    rules = render_crd(POLICY_VERSION)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"
    ]
    assert any("must not be ahead of policyVersion" in rule["message"] for rule in rules)


def test_the_fleet_status_publishes_the_policy_version_and_every_shards_weights() -> None:
    members = [member("s1", 3), member("s0", None, stale=True)]
    status = fleet_status(fleet(), members, generation=1, previous=None, now=T0, policy_version=3).to_kube()
    assert status["policyVersion"] == 3
    assert status["shardWeights"] == [
        {"name": "s0", "stale": True},
        {"name": "s1", "weightsVersion": 3, "stale": False},
    ]
    assert "policyVersion" not in fleet_status(fleet(), members, generation=1, previous=None, now=T0).to_kube()


def test_refitting_and_failed_entries_apply_even_on_first_sighting() -> None:
    """They only take traffic away, so a replay of one is safe: the trainer's last word on the shard stands."""
    refitting = RefitRecord(shard="s0", version=2, phase="Refitting")
    failed = RefitRecord(shard="s1", version=2, phase="Failed")
    states = {"s0": state(instance="w:1", stale=True), "s1": state(instance="w:1", stale=True)}
    assert refits_to_apply([refitting, failed], {}, states, first_sighting=True) == ([refitting, failed], [])
