"""The commit decision for an answer's weights, and the identity parsers: pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.weights import (
    OutageEpochs,
    lag_label,
    parse_process_start_time,
    parse_weight_version,
    weights_verdict,
)

versions = st.one_of(st.none(), st.integers(min_value=0, max_value=50))


def test_untracked_weights_always_commit() -> None:
    verdict = weights_verdict(None, None, None, 0)
    assert verdict.committable
    assert verdict.version is None
    assert verdict.lag is None


def test_on_policy_answer_commits_at_lag_zero() -> None:
    verdict = weights_verdict(4, 4, 4, 0)
    assert verdict.committable
    assert verdict.version == 4
    assert verdict.lag == 0


def test_unknown_version_is_not_committed() -> None:
    verdict = weights_verdict(4, 4, None, 3)
    assert not verdict.committable
    assert "unknown" in verdict.reason


def test_weights_changed_mid_attempt_are_not_committed_even_within_lag() -> None:
    verdict = weights_verdict(5, 4, 5, 2)
    assert not verdict.committable
    assert "changed during the attempt" in verdict.reason


def test_lag_beyond_the_bound_is_not_committed() -> None:
    assert weights_verdict(5, 3, 3, 2).committable
    verdict = weights_verdict(6, 3, 3, 2)
    assert not verdict.committable
    assert verdict.lag == 3


def test_negative_max_lag_is_an_error() -> None:
    with pytest.raises(ValueError, match="max_weights_lag"):
        weights_verdict(1, 1, 1, -1)


@given(policy=versions, started=versions, answered=versions, max_lag=st.integers(min_value=0, max_value=5))
def test_a_committed_tracked_answer_is_always_within_lag(
    policy: int | None, started: int | None, answered: int | None, max_lag: int
) -> None:
    """Invariant: with a published policy, a committed answer had one known version within max_lag behind it."""
    verdict = weights_verdict(policy, started, answered, max_lag)
    if policy is not None and verdict.committable:
        assert answered is not None
        assert started == answered
        assert 0 <= policy - answered <= max_lag


def test_lag_labels_are_bounded() -> None:
    assert [lag_label(x) for x in (None, 0, 9, 10, 500)] == ["unknown", "0", "9", "10+", "10+"]


def test_weight_version_bodies() -> None:
    assert parse_weight_version({"weight_version": "default"}) == "default"
    assert parse_weight_version({"weight_version": 7}) == "7"
    assert parse_weight_version({"weight_version": None}) is None
    assert parse_weight_version({"weight_version": {"x": 1}}) is None
    assert parse_weight_version(["weight_version"]) is None
    assert parse_weight_version({"weight_version": ""}) is None


def test_process_start_time_from_metrics_text() -> None:
    text = "# HELP process_start_time_seconds Start time.\n# TYPE process_start_time_seconds gauge\n"
    text += "process_start_time_seconds 1.7e9\n"
    assert parse_process_start_time(text) == repr(1.7e9)
    assert parse_process_start_time("other_metric 1\n") is None
    assert parse_process_start_time("this is { not prometheus") is None


def test_outage_epochs_count_long_outages_only() -> None:
    epochs = OutageEpochs(10.0)
    assert epochs.observe("a", True, 0.0) == "outage_epoch:0"
    epochs.observe("a", False, 1.0)
    assert epochs.observe("a", True, 5.0) == "outage_epoch:0"  # a blip
    epochs.observe("a", False, 6.0)
    assert epochs.observe("a", True, 20.0) == "outage_epoch:1"
    assert epochs.identity_of("b") == "outage_epoch:0"
    with pytest.raises(ValueError, match="dead_after_seconds"):
        OutageEpochs(0)
