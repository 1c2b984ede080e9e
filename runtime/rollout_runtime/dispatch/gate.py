"""Attempts wait for room on their shard (:class:`~rollout_runtime.dispatch.room.Room`), in order.

The asynchronous shell around the pure room, the dispatcher's one backpressure mechanism (the router's requests go
through the dispatcher, so they share it): an attempt (``attempt.py``) calls :meth:`Gate.enter` before it sends and
:meth:`Gate.leave` with its answer. A shard with room takes the request at once (a shard that never said "busy"
always has room, so this costs a fleet without backpressure one dictionary lookup); otherwise the request waits,
first come first served, until one of that shard's requests ends or its hold or next probe is due. A waiting attempt
is still the dispatcher's attempt on that shard (counted in its load, so least-outstanding selection sends new
requests to the shards with the shortest queues, and evicted with it if the shard leaves the fleet).
"""

from __future__ import annotations

import asyncio
import collections

from rollout_runtime.dispatch.room import Room, Ticket

__all__ = ["Gate"]


class Gate:
    """Per-shard queues in front of a :class:`Room`."""

    def __init__(self, room: Room | None = None) -> None:
        self.room = room if room is not None else Room()
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    async def enter(self, shard: str) -> Ticket:
        """A ticket to send to ``shard``: at once when it has room and nobody waits for it, else in turn."""
        loop = asyncio.get_running_loop()
        queue = self._waiting.get(shard)
        if not queue:
            ticket = self.room.acquire(shard, loop.time())
            if ticket is not None:
                return ticket
            queue = self._waiting.setdefault(shard, collections.deque())
        turn: asyncio.Future[None] = loop.create_future()
        queue.append(turn)
        self._schedule(shard)
        try:
            while True:
                await turn
                ticket = self.room.acquire(shard, loop.time())
                if ticket is not None:
                    self._wake(shard)  # there may be room for the next one too (a probe, several endings)
                    return ticket
                turn = loop.create_future()
                queue.appendleft(turn)  # still first in line
                self._schedule(shard)
        except BaseException:
            if turn in queue:
                queue.remove(turn)
            elif turn.done() and not turn.cancelled():
                self._wake(shard)  # woken, then cancelled: pass the turn on
            raise

    def leave(self, ticket: Ticket, *, busy: bool = False, retry_after: float | None = None) -> None:
        """The answer to ``ticket`` arrived (``busy``: a 429, or a 503 with a Retry-After): the next in line may go."""
        self.room.release(ticket, asyncio.get_running_loop().time(), busy=busy, retry_after=retry_after)
        self._wake(ticket.shard)

    def forget(self, shard: str) -> None:
        """``shard`` left the fleet: its learned room goes (its waiting attempts are evicted by the rotation)."""
        self.room.forget(shard)
        timer = self._timers.pop(shard, None)
        if timer is not None:
            timer.cancel()

    def waiting(self, shard: str) -> int:
        """Requests waiting for room on ``shard``."""
        return len(self._waiting.get(shard, ()))

    def _wake(self, shard: str) -> None:
        queue = self._waiting.get(shard)  # kept when empty: a woken waiter may come back to it
        while queue:
            turn = queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return

    def _schedule(self, shard: str) -> None:
        """Wake the first in line when the shard's hold or next probe is due (nothing else would)."""
        loop = asyncio.get_running_loop()
        due = self.room.reopens_at(shard, loop.time())
        timer = self._timers.get(shard)
        if due is None or (timer is not None and timer.when() <= due and not timer.cancelled()):
            return
        if timer is not None:
            timer.cancel()
        self._timers[shard] = loop.call_at(due, self._due, shard)

    def _due(self, shard: str) -> None:
        self._timers.pop(shard, None)
        self._wake(shard)
