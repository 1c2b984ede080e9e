"""The write schedule, pure: pass order, when targets and fleets are written, retries. Loop times are plain numbers."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fleet_operator.decisions import FLEET_VOLATILE_KEYS, SHARD_VOLATILE_KEYS
from fleet_operator.schedule import PASS_ORDER, Sweep, TargetWrite, WriteSchedule, WriteState, retry_delay

HEARTBEAT = 60.0
COALESCE = 0.5
SCHEDULE = WriteSchedule(heartbeat_seconds=HEARTBEAT, coalesce_seconds=COALESCE, retry_seconds=1.0)
STATUS: dict[str, Any] = {"phase": "Healthy", "endpoint": "http://s0:8000", "latencyMilliseconds": 1.0}


def written(status: dict[str, Any], at: float) -> WriteState:
    state = WriteState()
    state.succeeded(status, at)
    return state


def test_a_pass_writes_transitions_then_fleets_then_heartbeats() -> None:
    assert PASS_ORDER == (Sweep.TRANSITIONS, Sweep.FLEETS, Sweep.HEARTBEATS)


def test_a_target_never_written_is_written_in_the_first_sweep() -> None:
    assert SCHEDULE.target_write(WriteState(), STATUS, SHARD_VOLATILE_KEYS, 0.0, sweep=Sweep.TRANSITIONS) is (
        TargetWrite.WRITE
    )


def test_a_phase_change_is_written_at_once_and_a_latency_change_waits_for_the_heartbeat() -> None:
    state = written(STATUS, at=100.0)
    unhealthy = {**STATUS, "phase": "Unhealthy"}
    slower = {**STATUS, "latencyMilliseconds": 9.0}
    for sweep in (Sweep.TRANSITIONS, Sweep.HEARTBEATS):
        assert SCHEDULE.target_write(state, unhealthy, SHARD_VOLATILE_KEYS, 101.0, sweep=sweep) is TargetWrite.WRITE
    assert SCHEDULE.target_write(state, slower, SHARD_VOLATILE_KEYS, 101.0, sweep=Sweep.HEARTBEATS) is (
        TargetWrite.NOTHING
    )
    due = 100.0 + HEARTBEAT
    assert SCHEDULE.target_write(state, slower, SHARD_VOLATILE_KEYS, due, sweep=Sweep.TRANSITIONS) is (
        TargetWrite.NOTHING
    ), "only the heartbeat sweep writes the volatile part"
    assert SCHEDULE.target_write(state, slower, SHARD_VOLATILE_KEYS, due, sweep=Sweep.HEARTBEATS) is TargetWrite.WRITE


def test_a_due_heartbeat_with_nothing_new_is_a_check_not_a_write() -> None:
    state = written(STATUS, at=100.0)
    assert SCHEDULE.target_write(state, STATUS, SHARD_VOLATILE_KEYS, 100.0 + HEARTBEAT, sweep=Sweep.HEARTBEATS) is (
        TargetWrite.CHECKED
    )


def test_null_fields_compare_as_absent_as_the_api_server_stores_them() -> None:
    state = written(STATUS, at=100.0)
    assert state.written == STATUS
    assert not state.needs_write({**STATUS, "lastError": None}, SHARD_VOLATILE_KEYS, heartbeat_due=True)
    resumed = WriteState()
    resumed.found({**STATUS, "lastError": None}, 5.0)
    assert (resumed.written, resumed.written_at) == (STATUS, 5.0)


def test_a_new_record_without_a_persisted_status_has_nothing_written() -> None:
    state = WriteState()
    state.found({}, 5.0)
    assert state.written is None
    assert state.written_at == float("-inf")


def test_the_next_look_at_a_target_is_its_heartbeat_or_its_retry_whichever_is_later() -> None:
    state = written(STATUS, at=100.0)
    assert SCHEDULE.target_next_due(state) == 100.0 + HEARTBEAT
    state.failed(now=200.0, base_delay=SCHEDULE.retry_seconds)
    assert SCHEDULE.target_next_due(state) == 201.0


def test_retries_back_off_from_the_base_delay_doubling_up_to_a_cap() -> None:
    state = WriteState()
    delays = [state.failed(now=0.0, base_delay=1.0) for _ in range(8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert state.retrying(29.9)
    assert not state.retrying(30.0)
    state.succeeded(STATUS, 40.0)
    assert (state.retry_delay, state.retrying(40.0)) == (0.0, False)
    assert state.failed(now=41.0, base_delay=1.0) == 1.0, "a success resets the backoff"


@given(st.floats(min_value=0.0, max_value=1e6), st.floats(min_value=0.001, max_value=100.0))
def test_a_retry_delay_is_never_below_the_base_nor_above_the_cap(previous: float, base: float) -> None:
    """Invariant: whatever came before, the next delay is at least ``base`` (or the cap, if lower) and at most 30 s."""
    delay = retry_delay(previous, base)
    assert min(base, 30.0) <= delay <= 30.0


def test_a_dirty_fleet_waits_for_its_coalescing_window() -> None:
    state = written({"healthy": "3/3"}, at=100.0)
    assert SCHEDULE.fleet_wait(state, dirty_since=110.0, now=110.2) == 110.0 + COALESCE
    assert SCHEDULE.fleet_wait(state, dirty_since=110.0, now=110.0 + COALESCE) is None


def test_a_clean_fleet_waits_for_its_heartbeat() -> None:
    state = written({"healthy": "3/3"}, at=100.0)
    assert SCHEDULE.fleet_wait(state, dirty_since=None, now=130.0) == 100.0 + HEARTBEAT
    assert SCHEDULE.fleet_wait(state, dirty_since=None, now=100.0 + HEARTBEAT) is None
    assert SCHEDULE.heartbeat_due(state, 100.0 + HEARTBEAT)


def test_a_fleet_waiting_for_a_retry_is_not_written_before_it_even_when_dirty() -> None:
    state = written({"healthy": "3/3"}, at=100.0)
    state.failed(now=200.0, base_delay=4.0)
    assert SCHEDULE.fleet_wait(state, dirty_since=150.0, now=201.0) == 204.0
    assert SCHEDULE.fleet_next_due(state, 201.0) == 204.0
    assert SCHEDULE.fleet_next_due(state, 204.0) == 204.0 + HEARTBEAT


def test_a_fleet_heartbeat_rewrites_only_the_heartbeat_time_when_due() -> None:
    state = written({"healthy": "3/3", "lastHeartbeatTime": "t0"}, at=100.0)
    newer = {"healthy": "3/3", "lastHeartbeatTime": "t1"}
    assert not state.needs_write(newer, FLEET_VOLATILE_KEYS, heartbeat_due=False)
    assert state.needs_write(newer, FLEET_VOLATILE_KEYS, heartbeat_due=True)
    assert state.needs_write({"healthy": "2/3", "lastHeartbeatTime": "t0"}, FLEET_VOLATILE_KEYS, heartbeat_due=False)
