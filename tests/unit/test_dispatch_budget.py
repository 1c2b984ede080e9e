"""Retry budgets and backoff: decisions as values, bounded delays."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.dispatch import (
    DataFailedDecision,
    DispatchPolicy,
    ExhaustedDecision,
    PromptBudget,
    RetryDecision,
    backoff_seconds,
    decide,
)
from rollout_runtime.failures import FailureClass

INFRA, DATA = FailureClass.INFRA, FailureClass.DATA


def test_defaults_back_off_one_two_four_then_cap_at_thirty_without_jitter() -> None:
    policy = DispatchPolicy(backoff_jitter=0)
    assert [backoff_seconds(policy, n, 0.0) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_jitter_only_shortens_the_delay_by_at_most_its_fraction() -> None:
    policy = DispatchPolicy(backoff_jitter=0.25)
    assert backoff_seconds(policy, 3, 0.0) == 4
    assert backoff_seconds(policy, 3, 0.999999) == pytest.approx(3.0, abs=1e-5)


def test_huge_failure_counts_do_not_overflow() -> None:
    policy = DispatchPolicy(max_infra_attempts=1000, backoff_multiplier=100, backoff_jitter=0)
    assert backoff_seconds(policy, 1000, 0.0) == 30


@given(
    initial=st.floats(0, 60),
    extra=st.floats(0, 600),
    multiplier=st.floats(1, 10),
    jitter=st.floats(0, 1),
    failures=st.integers(1, 1000),
    draw=st.floats(0, 1, exclude_max=True),
)
def test_backoff_stays_within_its_bounds(
    initial: float, extra: float, multiplier: float, jitter: float, failures: int, draw: float
) -> None:
    """Invariant: (1 - jitter) * min(max, initial * multiplier**(n-1)) <= delay <= backoff_max_seconds."""
    policy = DispatchPolicy(
        backoff_initial_seconds=initial,
        backoff_max_seconds=initial + extra,
        backoff_multiplier=multiplier,
        backoff_jitter=jitter,
    )
    delay = backoff_seconds(policy, failures, draw)
    try:
        nominal = min(policy.backoff_max_seconds, initial * multiplier ** (failures - 1))
    except OverflowError:
        nominal = policy.backoff_max_seconds
    assert 0 <= delay <= policy.backoff_max_seconds
    assert delay >= nominal * (1 - jitter) - 1e-9


def test_backoff_rejects_nonsense_arguments() -> None:
    with pytest.raises(ValueError, match="infra_failures must be >= 1"):
        backoff_seconds(DispatchPolicy(), 0, 0.0)
    with pytest.raises(ValueError, match=r"draw must be within \[0, 1\)"):
        backoff_seconds(DispatchPolicy(), 1, 1.0)


def test_infra_failures_retry_with_backoff_until_the_budget_is_spent() -> None:
    policy = DispatchPolicy(max_infra_attempts=3, backoff_jitter=0)
    budget = PromptBudget()
    decisions = []
    for _ in range(3):
        budget.infra_failures += 1
        decisions.append(decide(policy, budget, INFRA))
    assert decisions == [RetryDecision(1.0), RetryDecision(2.0), ExhaustedDecision()]


def test_data_failures_retry_at_once_then_fail() -> None:
    policy = DispatchPolicy(max_data_attempts=2)
    budget = PromptBudget(data_failures=1)
    assert decide(policy, budget, DATA) == RetryDecision(0.0)
    budget.data_failures = 2
    assert decide(policy, budget, DATA) == DataFailedDecision(terminal=False)


def test_terminal_data_failure_stops_at_once() -> None:
    assert decide(DispatchPolicy(), PromptBudget(data_failures=1), DATA, terminal=True) == DataFailedDecision(True)


def test_budgets_are_independent() -> None:
    """Spent infra attempts do not shorten the data budget, nor the reverse."""
    policy = DispatchPolicy(max_infra_attempts=2, max_data_attempts=2, backoff_jitter=0)
    budget = PromptBudget(infra_failures=1, data_failures=1)
    assert decide(policy, budget, DATA) == RetryDecision(0.0)
    assert decide(policy, budget, INFRA) == RetryDecision(1.0)


def test_evictions_count_as_attempts_but_charge_no_budget() -> None:
    policy = DispatchPolicy(max_infra_attempts=1)
    budget = PromptBudget(evictions=10)
    assert budget.attempts == 10
    budget.infra_failures = 1
    assert decide(policy, budget, INFRA) == ExhaustedDecision()
