"""FleetWeights: the dispatcher's view of weights in cluster mode, read from a RolloutFleet's status."""

from __future__ import annotations

from rollout_runtime.shards.kubernetes_weights import FleetWeights
from rollout_runtime.weights import WeightsView, weights_verdict


def test_fleet_weights_reads_the_policy_version_and_each_shards_weights() -> None:
    weights = FleetWeights()
    assert isinstance(weights, WeightsView), "the dispatcher only gates with a WeightsView"
    weights.update(
        {
            "policyVersion": 3,
            "shardWeights": [
                {"name": "s0", "weightsVersion": 3, "stale": False},
                {"name": "s1", "stale": True},
                {"weightsVersion": 9},
                "garbage",
            ],
        }
    )
    assert weights.policy_version == 3
    assert (weights.version_of("s0"), weights.version_of("s1"), weights.version_of("unlisted")) == (3, None, None)
    assert weights.stale_shards() == {"s0": False, "s1": True}


def test_answers_from_a_stale_or_unlisted_shard_are_not_committed_once_a_policy_is_published() -> None:
    weights = FleetWeights()
    weights.update({"policyVersion": 2, "shardWeights": [{"name": "s0", "weightsVersion": 2}, {"name": "s1"}]})
    lag = 0
    assert weights_verdict(weights.policy_version, 2, weights.version_of("s0"), lag).committable
    assert not weights_verdict(weights.policy_version, None, weights.version_of("s1"), lag).committable
    assert not weights_verdict(weights.policy_version, None, weights.version_of("gone"), lag).committable


def test_without_a_published_policy_every_answer_commits_and_a_deleted_fleet_knows_nothing() -> None:
    weights = FleetWeights()
    weights.update({"shardWeights": [{"name": "s0"}]})
    assert weights.policy_version is None
    assert weights_verdict(weights.policy_version, None, weights.version_of("s0"), 0).committable
    weights.update({"policyVersion": 1, "shardWeights": [{"name": "s0", "weightsVersion": 1}]})
    weights.update(None)
    assert (weights.policy_version, weights.version_of("s0"), dict(weights.stale_shards())) == (None, None, {})


def test_a_version_published_in_this_process_gates_at_once_and_the_status_only_catches_up() -> None:
    weights = FleetWeights()
    weights.update({"policyVersion": 1, "shardWeights": [{"name": "s0", "weightsVersion": 1}]})
    weights.published(2)  # the operator has not written the fleet status yet
    assert weights.policy_version == 2
    assert not weights_verdict(weights.policy_version, 1, weights.version_of("s0"), 0).committable
    weights.update({"policyVersion": 1, "shardWeights": [{"name": "s0", "weightsVersion": 1}]})
    assert weights.policy_version == 2, "an older status must not loosen the gate"
    weights.update({"policyVersion": 3, "shardWeights": [{"name": "s0", "weightsVersion": 3}]})
    assert weights.policy_version == 3
