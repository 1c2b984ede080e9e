"""Passive outlier ejection: doubling times with a cap, un-ejection by time or probe, and the panic rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.dispatch import EjectionTracker, max_ejectable

NAMES = ("a", "b", "c", "d")


def tracker(base: float = 10, cap: float = 80, percent: float = 50) -> EjectionTracker:
    return EjectionTracker(base, cap, percent)


def test_first_ejection_lasts_the_base_time_and_ends_on_time() -> None:
    t = tracker()
    ejection = t.eject("a", now=100, wall=1000, healthy=NAMES)
    assert ejection is not None
    assert (ejection.seconds, ejection.until, ejection.count) == (10, 110, 1)
    assert t.expire(109.9) == []
    assert t.is_ejected("a")
    assert t.expire(110) == ["a"]
    assert not t.is_ejected("a")


def test_repeated_ejections_double_up_to_the_cap() -> None:
    t = tracker(base=10, cap=80)
    seconds = []
    now = 0.0
    for _ in range(6):
        ejection = t.eject("a", now=now, wall=now, healthy=NAMES)
        assert ejection is not None
        seconds.append(ejection.seconds)
        now = ejection.until
        t.expire(now)
    assert seconds == [10, 20, 40, 80, 80, 80]


def test_the_ejection_count_is_forgotten_after_a_quiet_max_period() -> None:
    t = tracker(base=10, cap=80)
    first = t.eject("a", now=0, wall=0, healthy=NAMES)
    assert first is not None
    t.expire(first.until)
    again = t.eject("a", now=first.until + 80, wall=0, healthy=NAMES)
    assert again is not None
    assert again.seconds == 10


def test_a_probe_success_after_the_ejection_restores_the_shard() -> None:
    t = tracker()
    t.eject("a", now=5, wall=1000, healthy=NAMES)
    assert t.probes_succeeded({"a": 999.0}, now=6) == [], "a probe older than the ejection proves nothing"
    assert t.probes_succeeded({"a": 1000.0}, now=6) == [], "nor one from the same instant"
    assert t.probes_succeeded({"a": 1000.5}, now=6) == ["a"]
    assert not t.is_ejected("a")
    assert t.next_expiry() is None


def test_an_ejected_shard_is_not_ejected_again() -> None:
    t = tracker()
    assert t.eject("a", now=0, wall=0, healthy=NAMES) is not None
    assert t.eject("a", now=1, wall=1, healthy=NAMES) is None


def test_a_shard_outside_the_healthy_set_is_not_ejected() -> None:
    assert tracker().eject("z", now=0, wall=0, healthy=NAMES) is None


@pytest.mark.parametrize(
    ("healthy", "percent", "expected"),
    [(0, 50, 0), (1, 100, 0), (2, 10, 1), (2, 100, 1), (4, 50, 2), (4, 10, 1), (10, 100, 9), (10, 0, 0)],
)
def test_max_ejectable_is_at_least_one_never_all_and_zero_when_disabled(
    healthy: int, percent: float, expected: int
) -> None:
    assert max_ejectable(healthy, percent) == expected


def test_panic_rule_refuses_ejections_past_the_limit() -> None:
    t = tracker(percent=50)
    assert t.eject("a", now=0, wall=0, healthy=NAMES) is not None
    assert t.eject("b", now=0, wall=0, healthy=NAMES) is not None
    assert t.eject("c", now=0, wall=0, healthy=NAMES) is None
    assert t.ejected == {"a", "b"}


def test_next_expiry_is_the_earliest_return() -> None:
    t = tracker(percent=100)
    t.eject("a", now=0, wall=0, healthy=NAMES)
    t.eject("b", now=3, wall=0, healthy=NAMES)
    assert t.next_expiry() == 10


def test_tracker_rejects_a_cap_below_the_base() -> None:
    with pytest.raises(ValueError, match="base_seconds <= max_seconds"):
        EjectionTracker(10, 5, 50)


@given(
    st.lists(
        st.tuples(st.sampled_from(["eject", "expire", "probe"]), st.sampled_from(NAMES), st.floats(0, 50)),
        max_size=60,
    ),
    st.integers(1, 4),
    st.floats(0, 100),
)
def test_never_ejects_every_healthy_shard(events: list[tuple[str, str, float]], size: int, percent: float) -> None:
    """Invariant: at no point are all shards of a non-empty healthy set ejected, nor more than the panic limit."""
    t = tracker(percent=percent)
    healthy = NAMES[:size]
    now = 0.0
    for action, name, step in events:
        now += step
        if action == "eject":
            t.eject(name, now=now, wall=now, healthy=healthy)
        elif action == "expire":
            t.expire(now)
        else:
            t.probes_succeeded({name: now + 1}, now=now)
        out = [n for n in healthy if t.is_ejected(n)]
        assert len(out) <= max_ejectable(len(healthy), percent)
        assert len(out) < len(healthy)


def test_a_restored_shard_is_on_trial_until_it_serves() -> None:
    t = tracker()
    t.eject("a", now=0, wall=0, healthy=NAMES)
    assert not t.on_trial("a"), "an ejected shard takes nothing, trial or not"
    t.expire(10)
    assert t.on_trial("a")
    t.served("a", started=-1)
    assert t.on_trial("a"), "an attempt sent before the ejection is stale evidence"
    t.served("a", started=10)
    assert not t.on_trial("a")
    t.eject("a", now=11, wall=11, healthy=NAMES)
    t.probes_succeeded({"a": 12.0}, now=12)
    assert t.on_trial("a"), "a probe's restore is a trial too"


def test_an_ejected_shard_serving_an_attempt_sent_after_its_ejection_is_restored() -> None:
    """Panic mode's way back: only panic mode sends attempts to an ejected shard, and one that succeeds is newer
    evidence than the failure; a success of an attempt sent before the ejection is not."""
    t = tracker()
    t.eject("a", now=5, wall=5, healthy=NAMES)
    assert not t.restore_served("a", started=4, now=6), "an attempt sent before the ejection is stale evidence"
    assert t.is_ejected("a")
    assert t.restore_served("a", started=5, now=6)
    assert not t.is_ejected("a")
    assert t.on_trial("a"), "restored on trial, which the success then ends"
    t.served("a", started=5)
    assert not t.on_trial("a")
    assert not t.restore_served("a", started=7, now=8), "a shard in rotation has nothing to be restored from"
    assert not t.restore_served("b", started=7, now=8)


def test_a_shard_the_panic_rule_keeps_is_held_for_the_backoff_doubling_until_it_serves() -> None:
    t = tracker(percent=50)

    def schedule(n: int) -> float:
        return 0.5 * 2 ** (n - 1)

    assert t.eject("a", now=0, wall=0, healthy=NAMES) is not None
    assert t.eject("b", now=0, wall=0, healthy=NAMES) is not None
    assert t.eject("c", now=0, wall=0, healthy=NAMES) is None, "the panic rule: 2 of 4 at most"
    assert t.hold("c", now=0, wall=0, schedule=schedule) == 0.5
    assert t.is_held("c")
    assert not t.is_ejected("c")
    assert t.hold("c", now=0.1, wall=0.1, schedule=schedule) is None, "held already"
    assert t.next_expiry() == 0.5
    assert t.expire(0.5) == [], "a released hold is no restored ejection"
    assert not t.is_held("c")
    assert t.on_trial("c")
    assert t.hold("c", now=1, wall=1, schedule=schedule) == 1.0, "a failed trial holds it twice as long"
    t.expire(2)
    t.served("c", started=0.5)
    assert t.on_trial("c"), "sent before the failed trial was held: stale"
    t.served("c", started=2)
    assert t.hold("c", now=3, wall=3, schedule=schedule) == 0.5, "a success starts the doubling again"


def test_holds_do_not_count_against_the_panic_rule_and_are_not_ejections() -> None:
    t = tracker(percent=50)
    t.eject("a", now=0, wall=0, healthy=NAMES)
    t.hold("b", now=0, wall=0, schedule=lambda n: 5.0)
    assert t.eject("c", now=0, wall=0, healthy=NAMES) is not None, "b is held, not ejected"
    assert t.ejected == {"a", "c"}
    assert t.eject("b", now=1, wall=1, healthy=NAMES) is None


def test_nothing_is_held_with_ejection_disabled_or_an_empty_backoff() -> None:
    assert tracker(percent=0).hold("a", now=0, wall=0, schedule=lambda n: 1.0) is None
    assert tracker().hold("a", now=0, wall=0, schedule=lambda n: 0.0) is None
    t = tracker()
    t.eject("a", now=0, wall=0, healthy=NAMES)
    assert t.hold("a", now=0, wall=0, schedule=lambda n: 1.0) is None, "an ejected shard is not held as well"


def test_a_probe_restores_only_past_the_grace_of_the_ejections_in_a_row() -> None:
    """A probe that passes all along (a 503 burst behind a 200 /health) would bring a shard back every period; the
    grace, the caller's backoff for the n-th ejection in a row, spaces those trials out."""
    t = EjectionTracker(10, 80, 50, probe_grace=lambda n: 0.5 * 2 ** (n - 1))
    t.eject("a", now=0, wall=100, healthy=NAMES)
    assert t.probes_succeeded({"a": 100.4}, now=0.4) == [], "within the first grace"
    assert t.probes_succeeded({"a": 100.5}, now=0.5) == ["a"]
    t.eject("a", now=1, wall=101, healthy=NAMES)
    assert t.probes_succeeded({"a": 101.9}, now=1.9) == [], "the second ejection in a row has twice the grace"
    assert t.probes_succeeded({"a": 102.0}, now=2) == ["a"]


def test_a_hold_on_a_probed_shard_ends_at_the_first_passing_probe_past_its_backoff() -> None:
    t = tracker(percent=50)
    t.eject("a", now=0, wall=100, healthy=NAMES)
    t.eject("b", now=0, wall=100, healthy=NAMES)
    t.probes_succeeded({"c": 99.0}, now=0)  # probes report on c
    assert t.hold("c", now=0, wall=100, schedule=lambda n: 0.1) == 0.1
    t.expire(0.1)
    assert t.is_held("c"), "the backoff ran out, but no probe has passed since"
    t.probes_succeeded({"c": 100.05}, now=0.2)
    assert t.is_held("c"), "that probe passed within the backoff"
    t.probes_succeeded({"c": 100.5}, now=0.5)
    assert not t.is_held("c")
    assert t.on_trial("c")


def test_a_hold_waiting_for_a_probe_ends_at_the_ejection_cap_if_none_passes() -> None:
    t = tracker(percent=50)
    t.eject("a", now=0, wall=0, healthy=NAMES)
    t.eject("b", now=0, wall=0, healthy=NAMES)
    t.probes_succeeded({"c": 0.0}, now=0)
    t.hold("c", now=0, wall=0, schedule=lambda n: 0.1)
    t.expire(0.1)
    due = t.next_expiry()
    assert due is not None
    assert due > 0.1, "a pending probe wait is a later expiry, not one due at once"
    t.expire(79)
    assert t.is_held("c")
    t.expire(80.1)
    assert not t.is_held("c")
    assert t.on_trial("c")


def test_a_trial_doubles_its_room_each_time_its_first_attempt_outlives_the_failure_by_the_margin() -> None:
    t = tracker()
    t.eject("a", now=0, wall=0, healthy=NAMES, took=0.05)  # a 503 that came back in 50 ms: spacing 0.2 s
    t.expire(10)
    assert t.trial_room("a", since=10, now=10) == (1, 10.2)
    assert t.trial_room("a", since=10, now=10.2) == (2, 10.4), "a due time computed as a multiple counts in full"
    assert t.trial_room("a", since=10, now=10.45) == (4, 10.6)
    t.eject("b", now=0, wall=0, healthy=NAMES)  # no duration known: one at a time until a success
    assert t.trial_room("b", since=10, now=99) == (1, None)
