"""When each target's next probe is due: one timer per target, pure (times are passed in, nothing is awaited).

Envoy's and HAProxy's health checkers run one timer per host, and so does this schedule: a target's next probe is
due ``period`` after its previous probe *started*, whatever any other target is doing. A target is never due while
its own probe is in flight (queued for a slot or running), so one target never overlaps itself; a slow or
blackholed target holds only its own timer and one concurrency slot.

The I/O loop (:class:`~rollout_runtime.health.monitor.HealthMonitor`) asks :meth:`ProbeSchedule.take_due` what
to start, tells :meth:`ProbeSchedule.started` when a probe actually got its slot and :meth:`ProbeSchedule.finished`
when it ended, and sleeps until :meth:`ProbeSchedule.next_due`. Due targets come out earliest-due first, which is
what makes the FIFO concurrency limit fair: under a saturated limit every target waits behind the probes that
were due before it, never behind a whole fleet's round.

A heap with lazy deletion keeps every operation O(log n) in the number of targets: a fleet of thousands of
targets on unaligned timers wakes the loop thousands of times a period.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Final, Generic, TypeVar

__all__ = ["CLOCK_SLACK_SECONDS", "ProbeSchedule"]

NameT = TypeVar("NameT", bound=Hashable)

CLOCK_SLACK_SECONDS: Final[float] = 1e-6
"""What is due within this much of now is due now. A loop sleeping "until due" for a remainder below the clock's
resolution wakes at once without time moving, and would spin (looptime makes that easy to hit, real clocks too)."""

_AT_ONCE: Final[float] = float("-inf")


class ProbeSchedule(Generic[NameT]):
    """Per-target due times. A target is *idle* (waiting for its due time) or *in flight* (taken, not finished)."""

    def __init__(self) -> None:
        self._due: dict[NameT, float] = {}
        """Idle targets -> loop time their next probe is due (the heap may hold stale entries; this is the truth)."""
        self._in_flight: set[NameT] = set()
        self._started_at: dict[NameT, float] = {}
        self._heap: list[tuple[float, int, NameT]] = []
        self._order = itertools.count()  # ties in due time go in the order they were scheduled

    def __contains__(self, name: object) -> bool:
        return name in self._due or name in self._in_flight

    def __len__(self) -> int:
        return len(self._due) + len(self._in_flight)

    @property
    def in_flight(self) -> frozenset[NameT]:
        return frozenset(self._in_flight)

    def due_at(self, name: NameT) -> float | None:
        """When an idle target is due (``-inf``: at once); None while it is in flight or unknown."""
        return self._due.get(name)

    def add(self, name: NameT) -> None:
        """Schedule a new target, due at once. A known target is left as it is."""
        if name not in self:
            self._set_due(name, _AT_ONCE)

    def remove(self, name: NameT) -> None:
        """Forget a target (its heap entries become stale); a later :meth:`add` starts it afresh."""
        self._due.pop(name, None)
        self._in_flight.discard(name)
        self._started_at.pop(name, None)

    def reset(self, name: NameT) -> None:
        """Make a known target due at once (a new endpoint: probe the new server now). It is no longer in flight:
        the caller has abandoned that probe."""
        if name in self:
            self._in_flight.discard(name)
            self._started_at.pop(name, None)
            self._set_due(name, _AT_ONCE)

    def retime(self, name: NameT, period_seconds: float) -> None:
        """A target's period changed: an idle target is due ``period_seconds`` after its previous start, if that is
        sooner than its current due time (a shorter period applies now, not after the old period ran out)."""
        due = self._due.get(name)
        started = self._started_at.get(name)
        if due is not None and started is not None and started + period_seconds < due:
            self._set_due(name, started + period_seconds)

    def take_due(self, now: float, limit: int | None = None) -> list[NameT]:
        """The idle targets due by ``now`` (within CLOCK_SLACK_SECONDS), earliest first, at most ``limit``; they are
        in flight from here until :meth:`finished`."""
        taken: list[NameT] = []
        while self._heap and (limit is None or len(taken) < limit):
            due, _, name = self._heap[0]
            if self._due.get(name) != due:  # stale: rescheduled, taken or removed since
                heapq.heappop(self._heap)
                continue
            if due > now + CLOCK_SLACK_SECONDS:
                break
            heapq.heappop(self._heap)
            del self._due[name]
            self._in_flight.add(name)
            taken.append(name)
        return taken

    def started(self, name: NameT, at: float) -> None:
        """The target's probe got its slot and started at ``at`` (its deadline runs from here)."""
        if name in self._in_flight:
            self._started_at[name] = at

    def finished(self, name: NameT, period_seconds: float) -> None:
        """The target's probe ended (or was given up before it started): its next probe is due ``period_seconds``
        after this one started, or at once if it never started."""
        if name not in self._in_flight:
            return  # removed or reset meanwhile
        self._in_flight.discard(name)
        started = self._started_at.get(name)
        self._set_due(name, _AT_ONCE if started is None else started + period_seconds)

    def next_due(self) -> float | None:
        """The earliest due time among idle targets (``-inf``: something is due at once); None if none is idle."""
        while self._heap:
            due, _, name = self._heap[0]
            if self._due.get(name) == due:
                return due
            heapq.heappop(self._heap)
        return None

    def _set_due(self, name: NameT, due: float) -> None:
        self._due[name] = due
        heapq.heappush(self._heap, (due, next(self._order), name))
