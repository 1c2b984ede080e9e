"""Adaptive per-attempt deadlines from a shard's own recent timings: pure numbers, no clock, no I/O.

A shard that stops producing tokens is noticed by the lack of progress, not by the attempt timeout or the next
probes: an attempt may go quiet for ``factor`` x the shard's recent p99 inter-token gap (clamped to the policy's
floor and cap) before it is abandoned. Before its first token (and for a non-streamed request, which shows no
tokens at all) the same rule applies to the shard's recent time to first progress. With fewer than
:data:`MIN_SAMPLES` timings the cap applies: a cold shard is given the benefit of the doubt.

The same samples give the hedging delay: a second attempt elsewhere after ``hedge_factor`` x the shard's p99
latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

__all__ = ["MIN_SAMPLES", "AttemptClock", "RecentSamples", "ShardTimings", "adaptive_deadline"]

MIN_SAMPLES: Final[int] = 8
"""Timings a shard needs before its own distribution, not the cap, sets its deadlines: the nearest-rank p99 of fewer
samples is their maximum, so a handful of fast warm-up answers would set a deadline no slower answer could meet."""
_CAPACITY: Final[int] = 128
"""Samples kept per timing: enough for a p99 that is not just the maximum, few enough that the window follows a
shard whose speed changes (a refit, a longer context) within a minute of its traffic."""


class RecentSamples:
    """The last ``capacity`` durations (a ring): adding is O(1); a quantile sorts a copy, so ask per attempt, not
    per token."""

    __slots__ = ("_capacity", "_next", "_values")

    def __init__(self, capacity: int = _CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self._values: list[float] = []
        self._next = 0

    def __len__(self) -> int:
        return len(self._values)

    def add(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        if len(self._values) < self._capacity:
            self._values.append(seconds)
        else:
            self._values[self._next] = seconds
            self._next = (self._next + 1) % self._capacity

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q`` quantile; None below :data:`MIN_SAMPLES` samples."""
        if len(self._values) < MIN_SAMPLES:
            return None
        ordered = sorted(self._values)
        rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        return ordered[rank]


def adaptive_deadline(samples: RecentSamples, *, factor: float, floor: float, cap: float) -> float:
    """``factor`` x the samples' p99, clamped to ``[floor, cap]``; ``cap`` while there are too few samples."""
    p99 = samples.quantile(0.99)
    if p99 is None:
        return cap
    return min(cap, max(floor, p99 * factor))


@dataclass(slots=True)
class ShardTimings:
    """What one shard's recent attempts looked like."""

    first: RecentSamples = field(default_factory=RecentSamples)
    """Start to first progress (a token, or the whole answer when nothing streamed)."""
    gaps: RecentSamples = field(default_factory=RecentSamples)
    """Between consecutive progress reports of one attempt."""
    latency: RecentSamples = field(default_factory=RecentSamples)
    """Start to success, whole attempts."""


class AttemptClock:
    """One attempt's progress against its deadlines. Fed times by the caller; decides, never waits.

    ``due()`` is when the attempt counts as stalled if nothing more arrives; :meth:`progress` moves it and records
    the gap in the shard's timings.
    """

    __slots__ = ("_first_allowed", "_gap_allowed", "_timings", "last", "started", "tokens")

    def __init__(self, timings: ShardTimings, started: float, *, factor: float, floor: float, cap: float) -> None:
        self._timings = timings
        self.started = started
        self.last = started
        self.tokens = 0
        self._first_allowed = adaptive_deadline(timings.first, factor=factor, floor=floor, cap=cap)
        self._gap_allowed = adaptive_deadline(timings.gaps, factor=factor, floor=floor, cap=cap)

    @property
    def allowed(self) -> float:
        """The quiet time allowed now: to the first progress, or between two."""
        return self._gap_allowed if self.tokens else self._first_allowed

    def due(self) -> float:
        return self.last + self.allowed

    def stalled(self, now: float) -> bool:
        return now >= self.due()

    def progress(self, now: float, tokens: int = 1) -> None:
        if self.tokens:
            self._timings.gaps.add(now - self.last)
        else:
            self._timings.first.add(now - self.started)
        self.tokens += tokens
        self.last = now

    def succeeded(self, now: float) -> None:
        """The attempt finished; an attempt that never reported progress counts its whole latency as its first."""
        if not self.tokens:
            self._timings.first.add(now - self.started)
        self._timings.latency.add(now - self.started)
