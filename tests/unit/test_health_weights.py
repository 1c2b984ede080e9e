"""The weights path of the shared health state machine: Stale and Refitting, restart evidence, refits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_runtime.health import HealthPhase, HealthState, ProbeReason, ProbeResult, ProbeSettings

OK = ProbeResult.success()
DOWN = ProbeResult.failure(ProbeReason.CONNECT, "refused")
FAST = ProbeSettings(success_threshold=1, failure_threshold=1)


def healthy_refit(version: int = 3, identity: str = "pod:0") -> HealthState:
    state = HealthState(FAST)
    state.observe(OK)
    state.observe_instance(identity)
    state.begin_refit()
    state.refit_succeeded(version)
    assert state.phase is HealthPhase.HEALTHY
    assert state.weights_version == version
    return state


def test_first_identity_is_recorded_not_a_restart() -> None:
    state = healthy_refit()
    assert state.observe_instance("pod:0") is None
    assert state.instance == "pod:0"
    assert state.serving


def test_identity_change_makes_a_refit_shard_stale_and_out_of_traffic() -> None:
    state = healthy_refit()
    transition = state.observe_instance("pod:1")
    assert transition is not None
    assert transition.reason == "restart"
    assert transition.to_phase is HealthPhase.STALE
    assert transition.serving_changed
    assert state.phase is HealthPhase.STALE
    assert not state.serving
    assert state.weights_version is None


def test_probes_alone_never_bring_a_stale_shard_back() -> None:
    state = healthy_refit()
    state.observe_instance("pod:1")
    for _ in range(10):
        state.observe(OK)
    assert state.phase is HealthPhase.STALE
    assert state.health_phase is HealthPhase.HEALTHY  # recorded underneath, like under Draining


def test_refit_brings_a_stale_shard_back_at_the_new_version() -> None:
    state = healthy_refit()
    state.observe_instance("pod:1")
    assert state.begin_refit() is not None
    assert state.phase is HealthPhase.REFITTING
    assert not state.serving
    transition = state.refit_succeeded(7, identity="pod:1")
    assert transition is not None
    assert transition.to_phase is HealthPhase.HEALTHY
    assert transition.reason == "refit"
    assert state.weights_version == 7
    assert state.serving


def test_failed_refit_leaves_the_shard_stale() -> None:
    state = healthy_refit()
    state.begin_refit()
    transition = state.refit_failed("update_weights_from_disk answered 400")
    assert transition is not None
    assert transition.to_phase is HealthPhase.STALE
    assert "400" in transition.message
    assert state.weights_version is None
    assert not state.serving


def test_a_shard_never_refit_has_no_version_to_lose() -> None:
    state = HealthState(FAST)
    state.observe(OK)
    state.observe_instance("pod:0")
    assert state.observe_instance("pod:1") is None
    assert state.serving
    assert state.instance == "pod:1"


def test_none_identity_is_no_evidence() -> None:
    state = healthy_refit()
    assert state.observe_instance(None) is None
    assert state.instance == "pod:0"
    assert state.serving


def test_refit_back_to_an_unhealthy_shard_shows_what_the_probes_say() -> None:
    state = healthy_refit()
    state.observe_instance("pod:1")
    state.observe(DOWN)
    state.begin_refit()
    transition = state.refit_succeeded(4)
    assert transition is not None
    assert transition.to_phase is HealthPhase.UNHEALTHY


def test_restore_refitting_resumes_stale() -> None:
    restored = HealthState.restore(FAST, HealthPhase.REFITTING, instance="pod:0", weights_version=3)
    assert restored.phase is HealthPhase.STALE
    assert restored.weights_version is None
    assert restored.instance == "pod:0"
    kept = HealthState.restore(FAST, HealthPhase.HEALTHY, instance="pod:0", weights_version=3)
    assert kept.weights_version == 3
    assert kept.observe_instance("pod:9") is not None


def test_negative_refit_version_is_refused() -> None:
    with pytest.raises(ValueError, match="policy step"):
        HealthState(FAST).refit_succeeded(-1)


_EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("probe"), st.booleans()),
        st.tuples(st.just("identity"), st.sampled_from(["a", "b", "c", None])),
        st.tuples(st.just("drain"), st.booleans()),
        st.tuples(st.just("begin_refit"), st.none()),
        st.tuples(st.just("refit_failed"), st.none()),
        st.tuples(st.just("mark_stale"), st.none()),
    ),
    max_size=40,
)


def _apply(state: HealthState, event: tuple[str, object]) -> None:
    kind, value = event
    if kind == "probe":
        state.observe(OK if value else DOWN)
    elif kind == "identity":
        state.observe_instance(value if isinstance(value, str) or value is None else None)
    elif kind == "drain":
        state.set_draining(bool(value))
    elif kind == "begin_refit":
        state.begin_refit()
    elif kind == "refit_failed":
        state.refit_failed("boom")
    else:
        state.mark_stale("lagging")


@settings(max_examples=300, deadline=None)
@given(first=st.sampled_from(["a", "b"]), events=_EVENTS)
def test_no_path_reaches_healthy_from_a_restart_without_a_refit(first: str, events: list[tuple[str, object]]) -> None:
    """Invariant: once a refit shard's identity changes (or a refit fails, or it is marked stale), no sequence of
    probes, identities, drains, refit starts or failed refits makes it serve again; only refit_succeeded does."""
    state = HealthState(ProbeSettings(success_threshold=1, failure_threshold=2))
    state.observe(OK)
    state.observe_instance(first)
    state.begin_refit()
    state.refit_succeeded(5)
    state.observe_instance("restarted")
    assert state.phase is HealthPhase.STALE
    for event in events:
        _apply(state, event)
        assert not state.serving, f"serving after {event} without a refit"
        assert state.weights_version is None
        assert state.phase in (HealthPhase.STALE, HealthPhase.REFITTING)
    state.begin_refit()
    state.refit_succeeded(6)
    assert state.weights_version == 6
    assert state.phase not in (HealthPhase.STALE, HealthPhase.REFITTING)


@settings(max_examples=200, deadline=None)
@given(events=_EVENTS)
def test_serving_implies_a_known_version_once_refit(events: list[tuple[str, object]]) -> None:
    """Invariant: after a first refit, whenever the shard serves, it has a known weights version."""
    state = healthy_refit()
    for event in events:
        _apply(state, event)
        if state.serving:
            assert state.weights_version == 3
