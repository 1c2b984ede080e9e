"""The per-target probe schedule, pure: every target on its own timer, due in order, never overlapping itself."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.health import ProbeSchedule


def test_new_targets_are_due_at_once_in_the_order_they_were_added() -> None:
    schedule: ProbeSchedule[str] = ProbeSchedule()
    for name in ("b", "a", "c"):
        schedule.add(name)
    assert schedule.next_due() == -math.inf
    assert schedule.take_due(0.0) == ["b", "a", "c"]
    assert schedule.next_due() is None, "everything is in flight"


def test_the_next_probe_is_due_a_period_after_the_previous_one_started() -> None:
    schedule: ProbeSchedule[str] = ProbeSchedule()
    schedule.add("a")
    assert schedule.take_due(0.0) == ["a"]
    schedule.started("a", 1.0)  # waited one second for a slot
    schedule.finished("a", 5.0)
    assert schedule.due_at("a") == 6.0
    assert schedule.take_due(5.9) == []
    assert schedule.take_due(6.0) == ["a"]


def test_a_slow_target_holds_only_its_own_timer() -> None:
    """The blackhole's probe is in flight for its whole timeout; the fast target comes due every period anyway."""
    schedule: ProbeSchedule[str] = ProbeSchedule()
    schedule.add("slow")
    schedule.add("fast")
    assert schedule.take_due(0.0) == ["slow", "fast"]
    schedule.started("slow", 0.0)
    starts = []
    for now in (0.0, 1.0, 2.0, 3.0):
        if now > 0:
            assert schedule.take_due(now) == ["fast"]
        schedule.started("fast", now)
        starts.append(now)
        schedule.finished("fast", 1.0)
    assert starts == [0.0, 1.0, 2.0, 3.0]
    assert schedule.due_at("slow") is None, "still in flight"
    schedule.finished("slow", 3600.0)
    assert schedule.due_at("slow") == 3600.0


def test_a_target_is_never_due_while_its_probe_is_in_flight() -> None:
    schedule: ProbeSchedule[str] = ProbeSchedule()
    schedule.add("a")
    schedule.take_due(0.0)
    schedule.started("a", 0.0)
    assert schedule.take_due(100.0) == []
    schedule.finished("a", 5.0)  # it overran its period: due at once
    assert schedule.take_due(100.0) == ["a"]


def test_a_probe_given_up_before_it_started_is_due_again_at_once() -> None:
    schedule: ProbeSchedule[str] = ProbeSchedule()
    schedule.add("a")
    schedule.take_due(0.0)
    schedule.finished("a", 5.0)
    assert schedule.due_at("a") == -math.inf


def test_take_due_respects_a_limit_and_keeps_the_rest_due_in_order() -> None:
    schedule: ProbeSchedule[str] = ProbeSchedule()
    for name in "abcd":
        schedule.add(name)
    assert schedule.take_due(0.0, limit=2) == ["a", "b"]
    assert schedule.take_due(0.0) == ["c", "d"]


def test_removed_targets_are_forgotten_and_readding_starts_afresh() -> None:
    schedule: ProbeSchedule[str] = ProbeSchedule()
    schedule.add("a")
    schedule.take_due(0.0)
    schedule.started("a", 0.0)
    schedule.remove("a")
    schedule.finished("a", 5.0)  # the abandoned probe ends late: nothing to reschedule
    assert "a" not in schedule
    assert schedule.next_due() is None
    schedule.add("a")
    assert schedule.take_due(0.0) == ["a"]


def test_reset_makes_a_target_due_at_once_even_in_flight() -> None:
    schedule: ProbeSchedule[str] = ProbeSchedule()
    schedule.add("a")
    schedule.take_due(0.0)
    schedule.started("a", 0.0)
    schedule.reset("a")
    assert schedule.take_due(0.0) == ["a"]


def test_a_shorter_period_applies_from_the_previous_start() -> None:
    schedule: ProbeSchedule[str] = ProbeSchedule()
    schedule.add("a")
    schedule.take_due(0.0)
    schedule.started("a", 0.0)
    schedule.finished("a", 3600.0)
    schedule.retime("a", 5.0)
    assert schedule.take_due(5.0) == ["a"]
    schedule.started("a", 5.0)
    schedule.finished("a", 5.0)
    schedule.retime("a", 3600.0)  # a longer period never postpones what is already due
    assert schedule.due_at("a") == 10.0


def test_due_within_the_clock_slack_is_due_now() -> None:
    schedule: ProbeSchedule[str] = ProbeSchedule()
    schedule.add("a")
    schedule.take_due(0.0)
    schedule.started("a", 0.0)
    schedule.finished("a", 0.3)
    assert schedule.take_due(0.3 - 1e-9) == ["a"]


periods = st.lists(st.sampled_from([0.5, 1.0, 2.0, 5.0, 3600.0]), min_size=1, max_size=6)


@given(periods=periods, durations=st.lists(st.floats(0.0, 0.99), min_size=1, max_size=6))
def test_every_target_keeps_its_period_whatever_the_others_take(periods: list[float], durations: list[float]) -> None:
    """Driving the schedule as the monitor does (start when due, finish after a fraction of the period), each
    target's starts are exactly one period apart: no other target's probe duration moves them."""
    schedule: ProbeSchedule[int] = ProbeSchedule()
    for index in range(len(periods)):
        schedule.add(index)
    starts: dict[int, list[float]] = {i: [] for i in range(len(periods))}
    ends: dict[int, float] = {}
    now, horizon = 0.0, 20.0
    while now <= horizon:
        for index in [i for i, end in ends.items() if end <= now]:
            del ends[index]
            schedule.finished(index, periods[index])
        for index in schedule.take_due(now):
            schedule.started(index, now)
            starts[index].append(now)
            ends[index] = now + durations[index % len(durations)] * periods[index]
        due = schedule.next_due()
        now = min([*ends.values(), due if due is not None else math.inf])
    for index, period in enumerate(periods):
        gaps = [b - a for a, b in zip(starts[index], starts[index][1:], strict=False)]
        assert all(math.isclose(gap, period) for gap in gaps), (index, period, starts[index])
        assert len(starts[index]) >= min(int(horizon // period), 1)
