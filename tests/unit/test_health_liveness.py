"""Passive liveness: a shard completing real requests is alive, so probe timeouts alone cannot take it out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.health import HealthPhase, HealthState, ProbeReason, ProbeResult, ProbeSettings

SETTINGS = ProbeSettings(period_seconds=5, timeout_seconds=2, failure_threshold=3, success_threshold=2)
OK = ProbeResult.success()
TIMEOUT = ProbeResult.failure(ProbeReason.TIMEOUT, "no answer within 2 s")
DEFINITE = {
    "connect": ProbeResult.failure(ProbeReason.CONNECT, "connection refused"),
    "5xx": ProbeResult.failure(ProbeReason.STATUS, "GET /health answered 503", status=503),
    "wrong model": ProbeResult.failure(ProbeReason.WRONG_MODEL, "expected model 'm' but the shard serves []"),
}


def healthy(settings: ProbeSettings = SETTINGS) -> HealthState:
    return HealthState.restore(settings, HealthPhase.HEALTHY, consecutive_successes=2)


def test_probe_timeouts_while_requests_complete_keep_the_shard_serving() -> None:
    state = healthy()
    phases = []
    for tick in range(10):
        now = tick * 5.0
        state.request_succeeded(now - 1.0)
        state.observe(TIMEOUT, now=now)
        phases.append(state.phase)
    assert phases == [HealthPhase.SUSPECT] * 10
    assert state.consecutive_failures == SETTINGS.failure_threshold - 1
    assert state.last_reason is ProbeReason.TIMEOUT


def test_the_same_timeouts_without_requests_make_it_unhealthy() -> None:
    state = healthy()
    for tick in range(3):
        state.observe(TIMEOUT, now=tick * 5.0)
    assert state.phase is HealthPhase.UNHEALTHY


@pytest.mark.parametrize("failure", DEFINITE.values(), ids=DEFINITE.keys())
def test_a_definite_failure_still_counts_while_requests_complete(failure: ProbeResult) -> None:
    state = healthy()
    state.request_succeeded(0.0)
    state.observe(TIMEOUT, now=1.0)
    state.observe(TIMEOUT, now=2.0)
    state.observe(failure, now=3.0)
    assert state.phase is HealthPhase.UNHEALTHY, "the excused timeouts left the streak one short; this completes it"


def test_request_evidence_expires_after_the_liveness_window() -> None:
    state = healthy()
    assert state.liveness_window_seconds == (SETTINGS.failure_threshold - 1) * SETTINGS.period_seconds
    state.request_succeeded(0.0)
    assert state.alive_at(10.0)
    assert not state.alive_at(10.5)
    state.observe(TIMEOUT, now=5.0)
    state.observe(TIMEOUT, now=10.0)
    assert state.phase is HealthPhase.SUSPECT
    state.observe(TIMEOUT, now=15.0)
    assert state.phase is HealthPhase.UNHEALTHY


def test_request_successes_never_raise_a_phase() -> None:
    """Only probes bring a shard back: a completion on a Pending or Unhealthy shard is no proof it serves."""
    for phase in (HealthPhase.PENDING, HealthPhase.UNHEALTHY, HealthPhase.SUSPECT):
        state = HealthState.restore(SETTINGS, phase, consecutive_failures=3 if phase is HealthPhase.UNHEALTHY else 0)
        state.request_succeeded(0.0)
        state.observe(TIMEOUT, now=0.0)
        assert state.phase is phase


def test_an_excused_timeout_never_lowers_an_unhealthy_streak() -> None:
    state = HealthState.restore(SETTINGS, HealthPhase.UNHEALTHY, consecutive_failures=5)
    state.request_succeeded(0.0)
    state.observe(TIMEOUT, now=1.0)
    assert state.consecutive_failures == 5


def test_failure_threshold_one_has_no_window() -> None:
    state = healthy(SETTINGS.model_copy(update={"failure_threshold": 1}))
    state.request_succeeded(0.0)
    state.observe(TIMEOUT, now=0.0)
    assert state.phase is HealthPhase.UNHEALTHY


def test_without_now_request_evidence_is_not_consulted() -> None:
    state = healthy()
    state.request_succeeded(0.0)
    for _ in range(3):
        state.observe(TIMEOUT)
    assert state.phase is HealthPhase.UNHEALTHY


def test_the_excusing_transition_says_why() -> None:
    state = healthy()
    state.request_succeeded(0.0)
    transition = state.observe(TIMEOUT, now=1.0)
    assert transition is not None
    assert (transition.to_phase, transition.reason) == (HealthPhase.SUSPECT, "timeout")
    assert "requests are completing" in transition.message


events = st.lists(
    st.tuples(
        st.floats(0.1, 10.0),  # time to the next event
        st.sampled_from(["ok", "timeout", "connect", "request"]),
    ),
    max_size=60,
)


@given(failure=st.integers(1, 5), period=st.sampled_from([1.0, 5.0]), history=events)
def test_a_target_leaves_within_the_bound_of_its_death_or_last_request(
    failure: int, period: float, history: list[tuple[float, str]]
) -> None:
    """Whatever came before, once probes fail and requests stop, a serving shard is out after at most
    ``failure_threshold`` failed probes spaced a period apart, i.e. within ``failure x period + timeout`` of the later
    of its death and its last completed request; and while requests complete, timeouts alone never take it out."""
    settings = ProbeSettings(period_seconds=period, timeout_seconds=period / 2, failure_threshold=failure)
    state = healthy(settings)
    now = 0.0
    last_request: float | None = None
    for gap, event in history:
        now += gap
        if event == "request":
            state.request_succeeded(now)
            last_request = now
            continue
        was_serving = state.serving
        if event == "ok":
            state.observe(OK, now=now)
        else:
            state.observe(TIMEOUT if event == "timeout" else DEFINITE["connect"], now=now)
        recent = last_request is not None and failure > 1 and now - last_request <= (failure - 1) * period
        if event == "timeout" and recent and was_serving:
            assert state.serving, "a timeout while requests complete took a serving shard out"
    # Death: requests stop, every probe times out, one a period apart (each finishing a timeout after its start).
    start = now
    for probe in range(1, failure + 1):
        state.observe(TIMEOUT, now=start + probe * period + settings.timeout_seconds)
    assert state.phase is HealthPhase.UNHEALTHY
