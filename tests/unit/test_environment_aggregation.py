"""Per-rollout scores -> task metrics; failures are counted, never scored as zero."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from rollout_runtime.environment import RolloutScore, aggregate_rollout_scores


def test_scores_are_grouped_by_task_and_failures_are_not_zero_rewards() -> None:
    metrics = aggregate_rollout_scores(
        [
            RolloutScore(task_id="a", reward=1.0),
            RolloutScore(task_id="a", reward=0.0),
            RolloutScore(task_id="a", reward=None),  # failed: excluded from reward statistics
            RolloutScore(task_id="b", reward=0.25),
        ]
    )
    a, b = metrics["a"], metrics["b"]
    assert (a.rollouts, a.scored, a.failed) == (3, 2, 1)
    assert a.mean_reward == 0.5
    assert a.pass_rate == 0.5
    assert a.solved
    assert (b.mean_reward, b.pass_rate, b.solved) == (0.25, 0.0, False)


def test_a_task_whose_rollouts_all_failed_has_no_reward_statistics() -> None:
    metrics = aggregate_rollout_scores([RolloutScore(task_id="t"), RolloutScore(task_id="t")])["t"]
    assert (metrics.failed, metrics.scored) == (2, 0)
    assert metrics.mean_reward is None
    assert metrics.pass_rate is None
    assert not metrics.solved


def test_non_finite_rewards_are_refused() -> None:
    with pytest.raises(ValidationError):
        RolloutScore(task_id="t", reward=math.nan)


scores = st.lists(
    st.builds(
        RolloutScore,
        task_id=st.sampled_from(["t1", "t2", "t3"]),
        reward=st.one_of(st.none(), st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)),
    ),
    max_size=60,
)


@given(scores, st.floats(min_value=-10, max_value=10, allow_nan=False))
def test_aggregation_accounts_for_every_rollout_once(rollouts: list[RolloutScore], threshold: float) -> None:
    """Invariant: per task, rollouts = scored + failed and they sum to the input; min <= mean <= max;
    pass_rate is in [0, 1] and solved iff some scored reward reaches the threshold."""
    metrics = aggregate_rollout_scores(rollouts, success_threshold=threshold)
    assert sum(m.rollouts for m in metrics.values()) == len(rollouts)
    for task, m in metrics.items():
        group = [r.reward for r in rollouts if r.task_id == task]
        scored = [r for r in group if r is not None]
        assert m.rollouts == m.scored + m.failed == len(group)
        assert m.scored == len(scored)
        if scored:
            assert m.min_reward is not None
            assert m.max_reward is not None
            assert m.mean_reward is not None
            assert m.min_reward <= m.mean_reward <= m.max_reward
            assert m.pass_rate is not None
            assert 0.0 <= m.pass_rate <= 1.0
            assert m.solved == any(r >= threshold for r in scored)
