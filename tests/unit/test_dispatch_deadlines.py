"""Adaptive deadlines: a shard's own recent timings, clamped to the policy's floor and cap."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.dispatch.deadlines import (
    MIN_SAMPLES,
    AttemptClock,
    RecentSamples,
    ShardTimings,
    adaptive_deadline,
)


def samples(*values: float) -> RecentSamples:
    recent = RecentSamples()
    for value in values:
        recent.add(value)
    return recent


def test_a_cold_shard_gets_the_cap() -> None:
    assert adaptive_deadline(samples(*[0.01] * (MIN_SAMPLES - 1)), factor=8, floor=1, cap=60) == 60


def test_a_warm_shard_gets_factor_times_its_p99_within_floor_and_cap() -> None:
    assert adaptive_deadline(samples(*[0.5] * 50, 2.0), factor=4, floor=1, cap=60) == 8.0
    assert adaptive_deadline(samples(*[0.01] * 50), factor=4, floor=1, cap=60) == 1
    assert adaptive_deadline(samples(*[100.0] * 50), factor=4, floor=1, cap=60) == 60


def test_the_ring_forgets_old_timings() -> None:
    recent = RecentSamples(capacity=MIN_SAMPLES)
    for value in [9.0] * MIN_SAMPLES + [1.0] * MIN_SAMPLES:
        recent.add(value)
    assert recent.quantile(0.99) == 1.0
    recent.add(float("nan"))
    recent.add(-1.0)
    assert len(recent) == MIN_SAMPLES


@given(st.lists(st.floats(min_value=0, max_value=1e4), min_size=MIN_SAMPLES, max_size=300), st.floats(0, 1))
def test_a_quantile_is_one_of_the_recent_samples(values: list[float], q: float) -> None:
    """Invariant: nearest-rank quantiles are samples, and monotone in q."""
    recent = samples(*values)
    kept = values[-128:] if len(values) > 128 else values
    assert recent.quantile(q) in kept
    assert (recent.quantile(q) or 0) <= (recent.quantile(1.0) or 0)


def test_an_attempt_is_stalled_only_after_its_quiet_allowance() -> None:
    timings = ShardTimings()
    for _ in range(20):
        timings.first.add(0.2)
        timings.gaps.add(0.05)
    clock = AttemptClock(timings, started=10.0, factor=10, floor=0.1, cap=30)
    assert clock.allowed == 2.0  # before the first token: 10 x p99 time to first token
    assert not clock.stalled(11.9)
    assert clock.stalled(12.0)
    clock.progress(10.3)
    assert clock.allowed == 0.5  # between tokens: 10 x p99 gap
    assert clock.due() == 10.8
    clock.progress(10.4, tokens=3)
    assert clock.tokens == 4
    assert len(timings.gaps) == 21


def test_an_answer_without_tokens_counts_as_first_progress() -> None:
    timings = ShardTimings()
    AttemptClock(timings, started=0.0, factor=2, floor=1, cap=9).succeeded(3.0)
    assert (len(timings.first), len(timings.latency), len(timings.gaps)) == (1, 1, 0)
