"""Per-prompt retry budgets and backoff: what to do after a failed attempt, as a value.

Infra and data failures draw on separate budgets because they mean different things: infra failures say the
fleet is sick (generous budget, back off so a sick fleet is not stormed), data failures say the prompt is bad
(small budget, retried at once on another shard only to confirm, then reported). Nothing here sleeps or
reads a clock; the engine acts on the decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.failures import FailureClass

__all__ = [
    "DataFailedDecision",
    "Decision",
    "ExhaustedDecision",
    "PromptBudget",
    "RetryDecision",
    "backoff_seconds",
    "decide",
]


@dataclass(slots=True)
class PromptBudget:
    """What one prompt has spent so far. Evicted attempts are counted but charged to neither budget."""

    infra_failures: int = 0
    data_failures: int = 0
    evictions: int = 0

    @property
    def attempts(self) -> int:
        """Attempts that ended without success."""
        return self.infra_failures + self.data_failures + self.evictions


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Attempt the prompt again after ``delay_seconds`` (zero: at once)."""

    delay_seconds: float


@dataclass(frozen=True, slots=True)
class DataFailedDecision:
    """Stop: the prompt is data-failed. ``terminal`` when the failure itself forbade any retry."""

    terminal: bool


@dataclass(frozen=True, slots=True)
class ExhaustedDecision:
    """Stop: the prompt used up its infra budget (skip it, or end the run: :mod:`drops` decides)."""


Decision = RetryDecision | DataFailedDecision | ExhaustedDecision


def backoff_seconds(policy: DispatchPolicy, infra_failures: int, draw: float) -> float:
    """Delay before the redispatch that follows the ``infra_failures``-th infra failure (1-based).

    ``initial * multiplier ** (n - 1)``, capped at ``backoff_max_seconds``, then reduced by up to
    ``backoff_jitter`` of itself according to ``draw`` in [0, 1): never more than the capped delay and never
    less than ``1 - jitter`` of it, so retries from many prompts spread out instead of arriving together.
    """
    if infra_failures < 1:
        raise ValueError(f"infra_failures must be >= 1, got {infra_failures}")
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"draw must be within [0, 1), got {draw}")
    try:
        delay = policy.backoff_initial_seconds * policy.backoff_multiplier ** (infra_failures - 1)
    except OverflowError:  # multiplier ** 999 does not fit a float; the cap applies anyway
        delay = policy.backoff_max_seconds
    delay = min(delay, policy.backoff_max_seconds)
    return delay * (1.0 - policy.backoff_jitter * draw)


def decide(
    policy: DispatchPolicy,
    budget: PromptBudget,
    failure_class: FailureClass,
    *,
    terminal: bool = False,
    draw: float = 0.0,
) -> Decision:
    """Decide after a failure that ``budget`` already includes.

    Data: terminal or out of data budget -> data-failed; otherwise retry at once (on another shard).
    Infra: out of infra budget -> exhausted; otherwise retry after the backoff for this failure count.
    """
    if failure_class is FailureClass.DATA:
        if terminal or budget.data_failures >= policy.max_data_attempts:
            return DataFailedDecision(terminal=terminal)
        return RetryDecision(0.0)
    if budget.infra_failures >= policy.max_infra_attempts:
        return ExhaustedDecision()
    return RetryDecision(backoff_seconds(policy, budget.infra_failures, draw))
