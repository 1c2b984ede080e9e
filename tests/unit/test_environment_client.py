"""The client's failure mapping as pure decisions: episode failures and bare HTTP errors onto the taxonomy."""

from __future__ import annotations

import pytest

from rollout_runtime.environment import EpisodeFailure, rollout_failure_for_episode, rollout_failure_for_http_error
from rollout_runtime.failures import (
    FailureClass,
    GymTransportError,
    RolloutDataFailure,
    RolloutInfraFailure,
    RolloutTerminalDataFailure,
    RolloutTimeout,
    classify_rollout_failure,
    http_status_is_infra,
)


@pytest.mark.parametrize(
    ("kind", "terminal", "expected"),
    [
        ("episode_failed", True, RolloutTerminalDataFailure),
        ("dependency_failed", True, RolloutTerminalDataFailure),
        ("episode_timeout", True, RolloutTerminalDataFailure),  # the server's terminal verdict wins
        ("dependency_failed", False, RolloutInfraFailure),
        ("admission_rejected", False, RolloutInfraFailure),
        ("episode_timeout", False, RolloutTimeout),
        ("admission_timeout", False, RolloutTimeout),
    ],
)
def test_episode_failures_map_by_their_terminal_flag(kind: str, terminal: bool, expected: type[Exception]) -> None:
    failure = EpisodeFailure(kind=kind, stage="s", reason="why", terminal=terminal)
    mapped = rollout_failure_for_episode(failure)
    assert type(mapped) is expected
    assert classify_rollout_failure(mapped) is (FailureClass.DATA if terminal else FailureClass.INFRA)
    assert "why" in str(mapped)


def test_bare_http_errors_follow_the_one_status_table() -> None:
    """Every error status 400..599 at once: the runtime's status decision picks transport error or data failure."""
    for status in range(400, 600):
        mapped = rollout_failure_for_http_error(status, '{"error": {"message": "nope"}}')
        expected = GymTransportError if http_status_is_infra(status) else RolloutDataFailure
        assert (type(mapped), mapped.status) == (expected, status)
        assert "nope" in str(mapped), status


def test_validation_details_reach_the_message() -> None:
    body = '{"error": {"message": "bad", "details": [{"loc": ["values", "0"], "msg": "Input should be an integer"}]}}'
    assert "values.0: Input should be an integer" in str(rollout_failure_for_http_error(422, body))


def test_a_non_json_error_body_is_kept_bounded() -> None:
    mapped = rollout_failure_for_http_error(502, "<html>" + "x" * 5000)
    assert str(mapped).startswith("environment server answered HTTP 502: <html>")
    assert len(str(mapped)) < 700


def test_a_refused_duplicate_attempt_is_infra_whichever_way_it_arrives() -> None:
    """A previous attempt of the episode is still live: the request is fine, so the runtime retries it later."""
    as_failure = rollout_failure_for_episode(
        EpisodeFailure(kind="episode_in_progress", stage="episode_identity", reason="still live", terminal=False),
        status=409,
    )
    bare = rollout_failure_for_http_error(
        409, '{"error": {"status": 409, "code": "episode_in_progress", "message": "still live"}}'
    )
    for failure in (as_failure, bare):
        assert classify_rollout_failure(failure) is FailureClass.INFRA
    assert isinstance(
        rollout_failure_for_http_error(409, '{"error": {"code": "conflict", "message": "x"}}'), RolloutDataFailure
    )
