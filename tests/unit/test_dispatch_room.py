"""A shard's room learned from its 429s (``dispatch/room.py``): pure, driven with explicit times."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_runtime.dispatch.room import DEFAULT_RETRY_SECONDS, Room, Ticket


def fill(room: Room, shard: str, count: int, now: float = 0.0) -> list[Ticket]:
    tickets = [room.acquire(shard, now) for _ in range(count)]
    assert all(ticket is not None for ticket in tickets)
    return [ticket for ticket in tickets if ticket is not None]


def test_a_shard_never_busy_has_no_limit() -> None:
    room = Room()
    assert len(fill(room, "a", 1000)) == 1000
    assert room.limit("a") is None
    assert room.reopens_at("a", 0.0) is None


def test_a_busy_answer_sets_the_limit_to_what_the_shard_held_when_the_refused_request_was_sent() -> None:
    room = Room()
    tickets = fill(room, "a", 6)  # the shard takes 4: the 5th and 6th are refused
    room.release(tickets[5], 0.001, busy=True, retry_after=2.0)
    room.release(tickets[4], 0.001, busy=True, retry_after=2.0)
    assert room.limit("a") == 4  # the smallest count wins: the 6th was sent with 5 ahead
    assert room.acquire("a", 0.002) is None  # 4 in flight: full
    room.release(tickets[0], 0.1)
    assert room.acquire("a", 0.1) is not None  # one ended: room for one
    assert room.acquire("a", 0.1) is None


def test_room_comes_back_by_one_probe_per_retry_after_and_a_refused_probe_costs_one_busy_answer() -> None:
    room = Room()
    tickets = fill(room, "a", 3)
    room.release(tickets[2], 0.0, busy=True, retry_after=1.0)  # limit 2
    assert room.acquire("a", 0.5) is None
    assert room.reopens_at("a", 0.5) == 1.0
    probe = room.acquire("a", 1.0)  # due: one past the limit
    assert probe is not None
    assert probe.ahead == 2
    assert room.limit("a") == 3
    assert room.acquire("a", 1.0) is None  # one probe per interval
    room.release(probe, 1.01, busy=True, retry_after=1.0)  # refused: the cap is still 2
    assert room.limit("a") == 2
    assert room.reopens_at("a", 1.01) == 2.01
    assert room.reopens_at("a", 2.01) is None  # due: only an ending can give it room now


def test_probes_that_are_not_refused_go_further_each_interval() -> None:
    room = Room()
    first = fill(room, "a", 9)
    room.release(first[8], 0.0, busy=True)  # limit 8, probe every DEFAULT_RETRY_SECONDS
    limits = []
    now = 0.0
    for _ in range(4):  # demand stays above the limit; nothing is refused
        now += DEFAULT_RETRY_SECONDS
        while room.acquire("a", now) is not None:
            pass
        limits.append(room.limit("a"))
    assert limits == [9, 11, 13, 16]  # steps 1, 2, 4 capped at a quarter of 11 (2), 4 capped at a quarter of 13 (3)


def test_a_shard_busy_with_nothing_of_ours_in_flight_is_held_for_its_retry_after_then_takes_one() -> None:
    room = Room()
    (only,) = fill(room, "a", 1)
    room.release(only, 0.0, busy=True, retry_after=3.0)
    assert room.acquire("a", 2.9) is None
    assert room.reopens_at("a", 2.9) == 3.0
    assert room.acquire("a", 3.0) is not None
    assert room.limit("a") == 1


def test_a_forgotten_shard_starts_again_with_no_limit_and_late_answers_are_ignored() -> None:
    room = Room()
    tickets = fill(room, "a", 3)
    room.release(tickets[2], 0.0, busy=True)
    room.forget("a")
    room.release(tickets[0], 0.1)
    assert room.limit("a") is None
    assert room.in_flight("a") == 0


def test_a_ticket_from_before_the_shard_left_does_not_free_room_in_its_next_life() -> None:
    """The shard leaves with a request out and comes back; the old request's answer arrives after the new life has
    one of its own out: only the new one counts."""
    room = Room()
    old = fill(room, "a", 1)[0]
    room.forget("a")
    new = room.acquire("a", 0.0)
    assert new is not None
    room.release(old, 0.1)
    assert room.in_flight("a") == 1, "the old life's answer freed the new life's request"
    room.release(new, 0.2)
    assert room.in_flight("a") == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.floats(0, 2)), max_size=60))
def test_in_flight_never_exceeds_the_limit_by_more_than_the_probe_step_and_never_goes_negative(
    events: list[tuple[bool, int, float]],
) -> None:
    """Whatever the order of sends, answers and busy answers: the count of requests in flight matches the tickets
    out, and a send only goes past the learned limit as a probe."""
    room = Room()
    out: list[Ticket] = []
    now = 0.0
    for send, pick, advance in events:
        now += advance
        if send:
            limit_before = room.limit("a")
            ticket = room.acquire("a", now)
            if ticket is not None:
                if limit_before is not None:
                    assert ticket.ahead < (room.limit("a") or 0)
                out.append(ticket)
        elif out:
            ticket = out.pop(pick % len(out))
            room.release(ticket, now, busy=pick % 2 == 0)
        assert room.in_flight("a") == len(out)
