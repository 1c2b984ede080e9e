"""What a prompt given up on costs: NeMo-RL's drop semantics (its ``RolloutFailureConfig`` names), as a value.

A prompt is *given up on* when a budget of :mod:`budget` runs out: its data budget (a :class:`DataFailed` outcome,
what NeMo-RL calls a *skipped* prompt) or its infra budget (a :class:`Skipped` outcome, NeMo-RL's *dropped* prompt).
Three allowances then decide whether the run goes on:

- ``max_skipped_prompts``: data-exhausted prompts over the dispatcher's lifetime (the training run). A dataset does
  not get better, so the count never resets.
- ``max_consecutive_dropped_prompts``: infra-exhausted prompts since the last completed one (any run's). It bounds
  an outage, not the run: a fleet losing the occasional shard goes on, one that stopped answering stops the run.
- ``min_step_batch_fraction``: a run of N prompts (one step) must keep ceil(fraction * N) of them; neither budget
  above can bound how short one step gets.

And ``on_dropped_prompt`` decides what the given-up prompt's batch position becomes: lost (``shrink``) or refilled
from the run's reserve (``replace``, at most ``max_replacement_attempts`` times per position, then shrink).
Nothing here does I/O; the engine keeps the counts and acts on the decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rollout_runtime.dispatch.policy import DispatchPolicy

__all__ = [
    "DropCounts",
    "DropDecision",
    "DropKind",
    "FailRun",
    "ReplaceDecision",
    "ShrinkDecision",
    "batch_floor",
    "decide_drop",
]

DropKind = Literal["data", "infra"]
"""Which budget ran out: data (the prompt is DataFailed) or infra (the prompt is Skipped)."""


@dataclass(slots=True)
class DropCounts:
    """The dispatcher's drop counters, over all its runs (NeMo-RL counts them for the training run)."""

    skipped_prompts: int = 0
    """Prompts that exhausted their data budget (never reset)."""
    consecutive_dropped_prompts: int = 0
    """Prompts that exhausted their infra budget since the last completed prompt."""

    def committed(self) -> None:
        """A prompt completed: the outage, if any, is over."""
        self.consecutive_dropped_prompts = 0


@dataclass(frozen=True, slots=True)
class ShrinkDecision:
    """Report the prompt; its run closes on one fewer result."""


@dataclass(frozen=True, slots=True)
class ReplaceDecision:
    """Report the prompt and dispatch the next reserve prompt in its batch position."""


@dataclass(frozen=True, slots=True)
class FailRun:
    """End the run: ``rule`` (the policy field) forbids giving up on this prompt; ``message`` says what to change."""

    rule: Literal["max_skipped_prompts", "max_consecutive_dropped_prompts", "min_step_batch_fraction"]
    message: str


DropDecision = ShrinkDecision | ReplaceDecision | FailRun


def batch_floor(policy: DispatchPolicy, size: int) -> int:
    """Prompts of a run of ``size`` that must complete: ceil(fraction * size), never rounded into one more drop.

    The product is rounded to 9 places first, so 0.7 * 10 (7.000000000000001 in floating point) is 7, not 8.
    """
    return math.ceil(round(policy.min_step_batch_fraction * size, 9))


def decide_drop(
    policy: DispatchPolicy,
    counts: DropCounts,
    kind: DropKind,
    *,
    size: int,
    lost: int,
    replaced: int,
    reserve_left: int,
) -> DropDecision:
    """Decide for a prompt just given up on; ``counts`` and ``lost`` do not include it yet.

    ``size``: the run's batch size (its prompts, replacements not counted; 0 for an open-ended session, which has no
    step and so no batch floor: only the two allowances apply); ``lost``: batch positions already lost
    (given up on and not refilled); ``replaced``: replacements this position has drawn so far; ``reserve_left``:
    reserve prompts not yet drawn. The allowances come first (a replaced prompt still counts against them), then the
    position: refilled when ``replace`` allows it, otherwise lost, which the batch floor must survive.
    """
    if kind == "data" and counts.skipped_prompts + 1 > policy.max_skipped_prompts:
        return FailRun(
            "max_skipped_prompts",
            f"{counts.skipped_prompts + 1} prompt(s) exhausted their data budget, more than max_skipped_prompts="
            f"{policy.max_skipped_prompts}; raise it to report such prompts as DataFailed and go on",
        )
    if kind == "infra" and counts.consecutive_dropped_prompts + 1 > policy.max_consecutive_dropped_prompts:
        return FailRun(
            "max_consecutive_dropped_prompts",
            f"{counts.consecutive_dropped_prompts + 1} prompt(s) in a row exhausted their infra budget, more than"
            f" max_consecutive_dropped_prompts={policy.max_consecutive_dropped_prompts}: the fleet is failing",
        )
    if policy.on_dropped_prompt == "replace" and replaced < policy.max_replacement_attempts and reserve_left > 0:
        return ReplaceDecision()
    floor = batch_floor(policy, size)
    if size > 0 and size - (lost + 1) < floor:
        return FailRun(
            "min_step_batch_fraction",
            f"the run lost {lost + 1} of {size} prompt(s), leaving fewer than {floor}"
            f" (min_step_batch_fraction={policy.min_step_batch_fraction:g}); lower it, or use"
            " on_dropped_prompt='replace' with a reserve",
        )
    return ShrinkDecision()
