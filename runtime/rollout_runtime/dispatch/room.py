"""Each shard's room, learned from its 429s: how many requests it takes at once before it answers "busy".

A shard that caps its concurrency answers the request past its cap with 429 (or 503 with a Retry-After). Sending
past the cap and retrying elsewhere is a storm; waiting out every Retry-After leaves the shard idle while its own
requests finish. This is the third way (the flow control llm-d's endpoint picker does): keep each shard at the
concurrency it showed it takes, queue the rest, and send when one of its requests ends.

- A shard never heard to be busy has no limit: nothing here slows a fleet that does not push back.
- A busy answer sets the shard's limit to the requests that were in flight on it when the refused one was sent (its
  :class:`Ticket` carries that count): what the shard was holding when it said "no more". Requests sent after the
  refused one, before its answer arrived, do not raise that figure (the smallest such count since the last probe
  wins).
- A busy answer with nothing else of ours in flight says the shard is full with others' work: it takes nothing
  until its Retry-After (or :data:`DEFAULT_RETRY_SECONDS`) has passed, then one request at a time.
- Capacity comes back by probing: while requests wait for a full shard, one more than its limit is allowed once per
  probe interval (its last Retry-After, else :data:`DEFAULT_RETRY_SECONDS`). A probe that is not refused doubles the
  next step (up to a quarter of the limit), so a shard whose capacity grew is found in a few intervals; a refused one
  resets the step to 1. At a steady cap that is one busy answer per shard per interval, whatever the load.

Pure: every call takes ``now`` (any monotonic clock, in seconds); no I/O, no tasks. The dispatcher's attempts wait
on it per shard (``gate.py``, its queues; ``attempt.py``), the router's requests among them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = ["DEFAULT_RETRY_SECONDS", "Room", "Ticket"]

DEFAULT_RETRY_SECONDS: Final[float] = 1.0
"""Probe interval and hold of a shard that said "busy" without a Retry-After: the delay a Retry-After of 1 would
ask, the smallest whole number of seconds the header can carry, so a shard that sends none is treated as the most
impatient one that does."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """One request sent to one shard, to hand back when its answer arrives."""

    shard: str
    ahead: int
    """Requests of ours already in flight on the shard when this one was sent."""
    epoch: int = 0
    """Which life of the shard in the room it was taken in: a ticket from before a :meth:`Room.forget` is ignored
    when it comes back, so it cannot free room the returning shard never gave."""


@dataclass(slots=True)
class _Shard:
    in_flight: int = 0
    limit: int | None = None
    """Requests it takes at once (None: never busy, no limit)."""
    closed_until: float = 0.0
    """Nothing is sent before this (a busy answer with nothing else in flight)."""
    probe_at: float = 0.0
    """When a request may go past the limit."""
    interval: float = DEFAULT_RETRY_SECONDS
    step: int = 1
    """How far the next probe goes past the limit."""
    probing: bool = False
    """The limit was raised by a probe no busy answer has refuted yet."""
    epoch: int = 0


@dataclass(slots=True)
class Room:
    """Each shard's learned limit and its requests in flight (see the module docstring)."""

    _shards: dict[str, _Shard] = field(default_factory=dict)
    _epochs: int = 0

    def acquire(self, shard: str, now: float) -> Ticket | None:
        """A ticket to send a request to ``shard`` now, or None: it has no room (wait for :meth:`release` or
        :meth:`reopens_at`)."""
        state = self._shards.get(shard)
        if state is None:
            state = self._shards[shard] = _Shard(epoch=self._epochs)
        if now < state.closed_until:
            return None
        limit = state.limit
        if limit is not None and state.in_flight >= limit:
            if now < state.probe_at:
                return None
            step = state.step
            if state.probing:  # the last probe was not refused within its interval: go further this time
                step = min(step * 2, max(1, limit // 4))
            if state.in_flight >= limit + step:  # still past it (the limit fell while requests were out): wait
                return None
            state.step = step
            state.limit = limit + step
            state.probing = True
            state.probe_at = now + state.interval
        ticket = Ticket(shard, state.in_flight, state.epoch)
        state.in_flight += 1
        return ticket

    def release(self, ticket: Ticket, now: float, *, busy: bool = False, retry_after: float | None = None) -> None:
        """The answer to ``ticket`` arrived; ``busy``: it was a 429 (or a 503 with a Retry-After)."""
        state = self._shards.get(ticket.shard)
        if state is None or state.epoch != ticket.epoch:  # forgotten while the request was out
            return
        state.in_flight = max(0, state.in_flight - 1)
        if not busy:
            return
        state.interval = retry_after if retry_after is not None and retry_after > 0 else DEFAULT_RETRY_SECONDS
        state.probe_at = now + state.interval
        state.step = 1
        state.probing = False
        learned = ticket.ahead
        if learned == 0:  # full with others' work: hold it, then one at a time
            state.closed_until = now + state.interval
            learned = 1
        state.limit = learned if state.limit is None else min(state.limit, learned)

    def reopens_at(self, shard: str, now: float) -> float | None:
        """When, after ``now``, ``shard`` may take a request without one of its own ending (its hold ends or its
        next probe is due); None if only an ending can give it room now."""
        state = self._shards.get(shard)
        if state is None or state.limit is None:
            return None
        due = max(state.closed_until, state.probe_at)
        return due if due > now else None

    def limit(self, shard: str) -> int | None:
        """Its learned limit (None: no limit)."""
        state = self._shards.get(shard)
        return None if state is None else state.limit

    def in_flight(self, shard: str) -> int:
        state = self._shards.get(shard)
        return 0 if state is None else state.in_flight

    def forget(self, shard: str) -> None:
        """The shard left the fleet (a returning one starts again with no limit: it may be a new process with
        another capacity, and one busy answer teaches its room again)."""
        self._shards.pop(shard, None)
        self._epochs += 1
