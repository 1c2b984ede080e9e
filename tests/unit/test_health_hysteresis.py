"""The shard health state machine: thresholds, phases, draining, and the no-flapping guarantees."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from rollout_runtime.health import HealthPhase, HealthState, ProbeReason, ProbeResult, ProbeSettings, Transition
from rollout_runtime.health.hysteresis import derived_timeout_seconds

OK = ProbeResult.success()
FAIL = ProbeResult.failure(ProbeReason.CONNECT, "connection refused")

P, H, S, U, D = (
    HealthPhase.PENDING,
    HealthPhase.HEALTHY,
    HealthPhase.SUSPECT,
    HealthPhase.UNHEALTHY,
    HealthPhase.DRAINING,
)


def run(state: HealthState, pattern: str) -> list[HealthPhase]:
    """Feed '+' (success) and '-' (failure) results; return the phase after each."""
    phases = []
    for char in pattern:
        state.observe(OK if char == "+" else FAIL)
        phases.append(state.phase)
    return phases


# ---------------------------------------------------------------------------------------------- settings


def test_probe_settings_defaults_match_the_crd_defaults() -> None:
    settings = ProbeSettings()
    assert (settings.path, settings.period_seconds, settings.timeout_seconds) == ("/health", 5.0, 2.0)
    assert (settings.failure_threshold, settings.success_threshold) == (3, 2)


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        ({"failure_threshold": 0}, "greater than or equal to 1"),
        ({"success_threshold": 0}, "greater than or equal to 1"),
        ({"timeout_seconds": 0}, "greater than 0"),
        ({"timeout_seconds": 5, "period_seconds": 5}, "must be less than period_seconds"),
        ({"timeout_seconds": 6, "period_seconds": 5}, "must be less than period_seconds"),
        ({"period_seconds": -1}, "greater than 0"),
        ({"path": "health"}, "absolute URL path"),
        ({"path": "//evil.example/health"}, "absolute URL path"),
        ({"path": "/health?x=1"}, "absolute URL path"),
        ({"unknown": 1}, "Extra inputs are not permitted"),
    ],
)
def test_probe_settings_reject_invalid_values(overrides: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        ProbeSettings.model_validate(overrides)


@pytest.mark.parametrize(
    ("given", "timeout"),
    [
        ({"period_seconds": 1}, 0.5),
        ({"periodSeconds": 1}, 0.5),
        ({"period_seconds": 3}, 1.5),
        ({"period_seconds": 4}, 2.0),
        ({"period_seconds": 60}, 2.0),
        ({"period_seconds": 1, "timeout_seconds": 0.2}, 0.2),
    ],
)
def test_probe_timeout_follows_the_period_when_only_the_period_is_given(
    given: dict[str, float], timeout: float
) -> None:
    assert ProbeSettings.model_validate(given).timeout_seconds == pytest.approx(timeout)


@given(st.floats(min_value=0.05, max_value=3600, allow_nan=False))
def test_a_period_alone_is_always_valid(period: float) -> None:
    """Whatever the period, the timeout derived from it is positive, at most 2 s and below the period."""
    settings = ProbeSettings(period_seconds=period)
    assert settings.timeout_seconds == derived_timeout_seconds(period)
    assert 0 < settings.timeout_seconds <= 2.0
    assert settings.timeout_seconds < settings.period_seconds


def test_probe_settings_accept_kubernetes_camel_case_and_dump_it() -> None:
    settings = ProbeSettings.model_validate({"periodSeconds": 10, "timeoutSeconds": 1, "failureThreshold": 5})
    assert (settings.period_seconds, settings.timeout_seconds, settings.failure_threshold) == (10, 1, 5)
    assert settings.model_dump(by_alias=True)["successThreshold"] == 2


def test_probe_result_ok_must_agree_with_reason() -> None:
    with pytest.raises(ValidationError, match="contradicts"):
        ProbeResult(ok=True, reason=ProbeReason.TIMEOUT)
    with pytest.raises(ValidationError, match="contradicts"):
        ProbeResult(ok=False)
    with pytest.raises(ValueError, match="failure reason"):
        ProbeResult.failure(ProbeReason.OK, "no")


def test_probe_result_message_is_bounded() -> None:
    result = ProbeResult.failure(ProbeReason.STATUS, "x" * 10_000)
    assert len(result.message) == 512
    assert result.message.endswith("...")


# ---------------------------------------------------------------------------------------------- phases


def test_new_shard_is_pending_and_does_not_serve() -> None:
    state = HealthState()
    assert state.phase is P
    assert not state.serving


def test_pending_becomes_healthy_only_after_success_threshold_successes() -> None:
    assert run(HealthState(), "++") == [P, H]


def test_pending_shard_that_never_answers_becomes_unhealthy_at_failure_threshold() -> None:
    assert run(HealthState(), "---") == [P, P, U]


def test_healthy_becomes_suspect_on_first_failure_and_unhealthy_at_threshold() -> None:
    assert run(HealthState(), "++---") == [P, H, S, S, U]


def test_suspect_still_serves() -> None:
    state = HealthState()
    run(state, "++-")
    assert state.phase is S
    assert state.serving


def test_unhealthy_does_not_serve() -> None:
    state = HealthState()
    run(state, "++---")
    assert not state.serving


def test_suspect_returns_to_healthy_after_success_threshold_successes() -> None:
    assert run(HealthState(), "++-++") == [P, H, S, S, H]


def test_a_success_breaks_the_failure_streak() -> None:
    # -- + -- never reaches three failures in a row
    assert run(HealthState(), "++--+--") == [P, H, S, S, S, S, S]


def test_unhealthy_recovers_only_after_success_threshold_consecutive_successes() -> None:
    assert run(HealthState(), "---+-++") == [P, P, U, U, U, U, H]


def test_failure_threshold_one_goes_straight_from_healthy_to_unhealthy() -> None:
    state = HealthState(ProbeSettings(failure_threshold=1, success_threshold=1))
    assert run(state, "+-+") == [H, U, H]


def test_consecutive_counts_and_last_error_are_tracked() -> None:
    state = HealthState()
    run(state, "+--")
    assert (state.consecutive_successes, state.consecutive_failures) == (0, 2)
    assert state.last_error == "connection refused"
    assert state.last_reason is ProbeReason.CONNECT
    run(state, "+")
    assert (state.consecutive_successes, state.consecutive_failures) == (1, 0)
    assert state.last_error == "connection refused"  # kept: it says what happened last time
    assert state.last_result is OK


def test_observe_returns_the_transition_with_its_cause() -> None:
    state = HealthState()
    assert state.observe(OK) is None
    assert state.observe(OK) == Transition(from_phase=P, to_phase=H, reason="ok", message="")
    transition = state.observe(FAIL)
    assert transition == Transition(from_phase=H, to_phase=S, reason="connect", message="connection refused")
    assert not transition.serving_changed
    state.observe(FAIL)
    transition = state.observe(FAIL)
    assert transition is not None
    assert (transition.to_phase, transition.serving_changed) == (U, True)


def test_draining_overrides_health_and_stops_serving() -> None:
    state = HealthState()
    run(state, "++")
    transition = state.set_draining(True)
    assert transition == Transition(from_phase=H, to_phase=D, reason="drain", message="draining: no new traffic")
    assert state.phase is D
    assert not state.serving
    assert state.set_draining(True) is None


def test_probes_keep_counting_while_draining_and_undrain_lands_on_their_verdict() -> None:
    state = HealthState()
    run(state, "++")
    state.set_draining(True)
    assert run(state, "---") == [D, D, D]
    assert state.health_phase is U
    transition = state.set_draining(False)
    assert transition is not None
    assert (transition.from_phase, transition.to_phase, transition.reason) == (D, U, "undrain")


def test_observe_while_draining_reports_no_transition() -> None:
    state = HealthState()
    state.set_draining(True)
    assert state.observe(OK) is None
    assert state.observe(OK) is None
    assert state.health_phase is H


def test_new_settings_apply_from_the_next_observation() -> None:
    state = HealthState()
    run(state, "++-")
    state.settings = ProbeSettings(failure_threshold=2)
    assert run(state, "-") == [U]


def test_restore_resumes_from_a_persisted_status() -> None:
    state = HealthState.restore(ProbeSettings(), U, consecutive_successes=1, last_error="boom")
    assert state.observe(OK) == Transition(from_phase=U, to_phase=H, reason="ok", message="")
    drained = HealthState.restore(ProbeSettings(), D)
    assert (drained.phase, drained.health_phase, drained.draining) == (D, P, True)
    with pytest.raises(ValueError, match="at once"):
        HealthState.restore(ProbeSettings(), H, consecutive_successes=1, consecutive_failures=1)


# ---------------------------------------------------------------------------------------------- properties

thresholds = st.integers(min_value=1, max_value=5)
histories = st.lists(st.booleans(), max_size=60)


def _settings(failure: int, success: int) -> ProbeSettings:
    return ProbeSettings(failure_threshold=failure, success_threshold=success)


@given(failure=thresholds, success=thresholds, history=histories)
def test_serving_only_starts_after_success_threshold_successes_in_a_row(
    failure: int, success: int, history: list[bool]
) -> None:
    """Invariant: whenever a shard starts serving, the last ``success_threshold`` probes all succeeded."""
    state = HealthState(_settings(failure, success))
    for i, ok in enumerate(history):
        before = state.serving
        state.observe(OK if ok else FAIL)
        if state.serving and not before:
            assert i + 1 >= success
            assert all(history[i + 1 - success : i + 1])


@given(failure=thresholds, success=thresholds, history=histories)
def test_serving_only_stops_after_failure_threshold_failures_in_a_row(
    failure: int, success: int, history: list[bool]
) -> None:
    """Invariant: whenever a serving shard stops serving, the last ``failure_threshold`` probes all failed."""
    state = HealthState(_settings(failure, success))
    for i, ok in enumerate(history):
        before = state.serving
        state.observe(OK if ok else FAIL)
        if before and not state.serving:
            assert i + 1 >= failure
            assert not any(history[i + 1 - failure : i + 1])


@given(failure=thresholds, success=thresholds, history=histories)
def test_never_flaps_faster_than_the_thresholds_allow(failure: int, success: int, history: list[bool]) -> None:
    """Invariant: between two flips of ``serving`` lie at least ``success_threshold`` observations before a
    flip up and at least ``failure_threshold`` before a flip down."""
    state = HealthState(_settings(failure, success))
    last_flip: int | None = None
    for i, ok in enumerate(history):
        before = state.serving
        state.observe(OK if ok else FAIL)
        if state.serving != before:
            if last_flip is not None:
                assert i - last_flip >= (success if state.serving else failure)
            last_flip = i


@given(failure=thresholds, success=thresholds, history=histories)
def test_thresholds_are_also_sufficient(failure: int, success: int, history: list[bool]) -> None:
    """Invariant (liveness): ``failure_threshold`` failures in a row always end Unhealthy, and
    ``success_threshold`` successes in a row always end Healthy, whatever came before."""
    for streak, ok, expected in ((failure, False, U), (success, True, H)):
        state = HealthState(_settings(failure, success))
        for previous in history:
            state.observe(OK if previous else FAIL)
        for _ in range(streak):
            state.observe(OK if ok else FAIL)
        assert state.phase is expected


@given(failure=thresholds, success=thresholds, history=histories)
def test_transitions_report_exactly_the_phase_changes(failure: int, success: int, history: list[bool]) -> None:
    """Invariant: observe() returns a transition iff the phase changed, and it names both phases."""
    state = HealthState(_settings(failure, success))
    for ok in history:
        before = state.phase
        transition = state.observe(OK if ok else FAIL)
        if state.phase is before:
            assert transition is None
        else:
            assert transition is not None
            assert (transition.from_phase, transition.to_phase) == (before, state.phase)
            assert transition.to_phase is not P  # nothing ever goes back to Pending


@given(
    failure=thresholds,
    success=thresholds,
    history=histories,
    drains=st.lists(st.booleans(), max_size=60),
)
def test_draining_never_serves_and_never_changes_the_probe_verdict(
    failure: int, success: int, history: list[bool], drains: list[bool]
) -> None:
    """Invariant: a draining shard never serves, and the phase underneath equals that of a twin fed the same
    probes without any draining."""
    drained = HealthState(_settings(failure, success))
    twin = HealthState(_settings(failure, success))
    for i, ok in enumerate(history):
        drained.set_draining(drains[i] if i < len(drains) else False)
        drained.observe(OK if ok else FAIL)
        twin.observe(OK if ok else FAIL)
        assert drained.health_phase is twin.phase
        if drained.draining:
            assert drained.phase is D
            assert not drained.serving
        else:
            assert drained.phase is twin.phase
