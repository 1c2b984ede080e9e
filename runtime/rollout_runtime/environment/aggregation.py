"""Aggregate per-rollout scores into task-level metrics.

A failed rollout is counted as failed, never scored as zero: a zero reward says the policy was wrong, a failure
says nothing about the policy, and mixing them corrupts the training signal.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RolloutScore", "TaskMetrics", "aggregate_rollout_scores"]


class RolloutScore(BaseModel):
    """One rollout's outcome: a finite reward, or a failure (``reward`` None)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: Annotated[str, Field(min_length=1, max_length=256)]
    reward: Annotated[float, Field(allow_inf_nan=False)] | None = None


class TaskMetrics(BaseModel):
    """Task-level metrics over its rollouts; reward statistics cover scored rollouts only."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    rollouts: int
    scored: int
    failed: int
    mean_reward: float | None
    min_reward: float | None
    max_reward: float | None
    std_reward: float | None
    pass_rate: float | None
    """Share of scored rollouts with reward >= the success threshold."""
    solved: bool
    """Any scored rollout reached the success threshold (pass@k over this task's k rollouts)."""


def aggregate_rollout_scores(
    scores: Iterable[RolloutScore], *, success_threshold: float = 1.0
) -> dict[str, TaskMetrics]:
    """Group scores by task and summarise each group."""
    by_task: dict[str, list[RolloutScore]] = defaultdict(list)
    for score in scores:
        by_task[score.task_id].append(score)
    return {task: _summarise(task, group, success_threshold) for task, group in sorted(by_task.items())}


def _summarise(task_id: str, group: list[RolloutScore], threshold: float) -> TaskMetrics:
    rewards = [s.reward for s in group if s.reward is not None]
    if not rewards:
        return TaskMetrics(
            task_id=task_id, rollouts=len(group), scored=0, failed=len(group), mean_reward=None, min_reward=None,
            max_reward=None, std_reward=None, pass_rate=None, solved=False,
        )  # fmt: skip
    mean = math.fsum(rewards) / len(rewards)
    variance = math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)
    passed = sum(1 for r in rewards if r >= threshold)
    return TaskMetrics(
        task_id=task_id,
        rollouts=len(group),
        scored=len(rewards),
        failed=len(group) - len(rewards),
        mean_reward=min(max(mean, min(rewards)), max(rewards)),  # rounding must not leave the range
        min_reward=min(rewards),
        max_reward=max(rewards),
        std_reward=math.sqrt(variance),
        pass_rate=passed / len(rewards),
        solved=passed > 0,
    )
