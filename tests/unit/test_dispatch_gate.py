"""The dispatcher's queues in front of each shard's room (``dispatch/gate.py``), on looptime's clock."""

from __future__ import annotations

import asyncio

import pytest

from rollout_runtime.dispatch.gate import Gate
from rollout_runtime.dispatch.room import Ticket


async def busy_at(gate: Gate, shard: str, cap: int, retry_after: float) -> list[Ticket]:
    """``cap`` requests in flight on ``shard`` and a refused one: its room is ``cap`` from now on."""
    tickets = [await gate.enter(shard) for _ in range(cap + 1)]
    gate.leave(tickets.pop(), busy=True, retry_after=retry_after)
    return tickets


async def queued(gate: Gate, shard: str, waiters: int) -> None:
    """Let the loop run until ``waiters`` attempts stand in ``shard``'s line (each gets there on its first turn)."""
    for _ in range(100):
        if gate.waiting(shard) >= waiters:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{gate.waiting(shard)} attempts wait for {shard}, not {waiters}")


async def test_waiters_go_in_order_one_per_request_that_ends() -> None:
    gate = Gate()
    held = await busy_at(gate, "a", 2, retry_after=60)
    order: list[int] = []

    async def wait(index: int) -> Ticket:
        ticket = await gate.enter("a")
        order.append(index)
        return ticket

    waiters = [asyncio.ensure_future(wait(i)) for i in range(3)]
    await queued(gate, "a", 3)
    assert gate.waiting("a") == 3
    assert order == []
    gate.leave(held[0])
    first = await waiters[0]
    assert order == [0]
    gate.leave(held[1])
    gate.leave(first)
    await asyncio.gather(waiters[1], waiters[2])
    assert order == [0, 1, 2]
    assert gate.room.in_flight("a") == 2


async def test_a_cancelled_waiter_gives_its_turn_to_the_next() -> None:
    gate = Gate()
    held = await busy_at(gate, "a", 1, retry_after=60)
    first = asyncio.ensure_future(gate.enter("a"))
    second = asyncio.ensure_future(gate.enter("a"))
    await queued(gate, "a", 2)
    gate.leave(held[0])  # wakes the first...
    first.cancel()  # ...which is cancelled before it runs
    ticket = await second
    assert ticket.shard == "a"
    with pytest.raises(asyncio.CancelledError):
        await first


@pytest.mark.looptime
async def test_a_shard_busy_with_others_work_takes_the_next_request_after_its_retry_after() -> None:
    gate = Gate()
    (only,) = [await gate.enter("a")]
    gate.leave(only, busy=True, retry_after=5.0)  # refused with nothing of ours in flight: held 5 s
    loop = asyncio.get_running_loop()
    started = loop.time()
    await gate.enter("a")
    assert loop.time() - started == pytest.approx(5.0)


async def test_shards_have_their_own_queues() -> None:
    gate = Gate()
    await busy_at(gate, "a", 1, retry_after=60)
    blocked = asyncio.ensure_future(gate.enter("a"))
    other = await gate.enter("b")  # "a" being full holds nobody back on "b"
    assert other.shard == "b"
    assert not blocked.done()
    blocked.cancel()
