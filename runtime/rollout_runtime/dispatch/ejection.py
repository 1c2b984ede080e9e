"""Passive outlier ejection with Envoy's semantics, as a pure state machine over (shard, time) events.

Probes are slow to notice a dead shard (period x failure threshold); the attempts that hit it notice at once.
So an infra failure on a shard ejects it from this runtime's view immediately, for
``base * 2 ** (n - 1)`` seconds capped at ``max`` (n = its ejections in a row; the count is forgotten once
the shard has stayed un-ejected for ``max`` seconds). It returns when the time runs out, or earlier when an
active probe succeeds *after* the ejection (``HealthySet.probe_ok_at``): Envoy's
``successful_active_health_check_uneject_host``, once the probe is at least ``probe_grace(n)`` past the n-th
ejection in a row (the caller's backoff). A probe that passes all along (a 503 burst behind a 200 ``/health``) then
brings a shard back for a trial at a growing interval rather than on every probe period.

A returning shard is **on trial** (a circuit breaker's half-open state): it starts with one attempt at a time, and
a failed trial ejects it again for twice as long. A shard that failed in a way its probe cannot see (``/health``
answers 200 while generation answers 503) would otherwise be handed a burst of attempts the moment a probe restores
it, since a least-outstanding selection favours the shard with nothing in flight. Each time its first trial attempt
outlives the failure that took it out by :data:`TRIAL_OUTLIVES` times (:meth:`EjectionTracker.trial_room`), twice
as many may be in flight, until one succeeds: a 503 burst answers in milliseconds and a generation takes far longer,
so a recovered shard is back to full load well before its first success, and one still failing takes one attempt.

Only a success that is *newer evidence* than the failure ends a trial or a run of holds: an attempt that started
before the shard was ejected or held (sent before its first failure came back) proves nothing about it now. A
shard's attempts in flight when a 503 burst starts still succeed afterwards, and counting them would clear the
trial and the backoff and hand the shard a fresh burst of attempts.

A shard the panic rule keeps in rotation is **held** instead: out of rotation until it could return from an
ejection, that is at the first passing probe at least the caller's backoff after the failure (doubling with each
failure in a row, reset by a success), or when the backoff runs out for a shard no probe reports on; then on trial.
Waiting for a probe matters: a hold that ended on the backoff alone would give a shard in a 503 burst a trial every
0.1, 0.2, 0.4 s, where an ejected one gets one per probe period. The rule exists so a few shards are not handed the
whole load; it must not turn a failing shard that answers at once into the cheapest choice for every attempt (a
least-outstanding selection's black hole). Holds do not count against the rule, and when every shard in rotation is
held, attempts wait for the first to return rather than going to ejected shards.

Panic rule (Envoy's ``max_ejection_percent``, made safe for small fleets): of the shards in the current
healthy set, at most ``max(1, floor(n * percent / 100))`` may be ejected at once, and never all of them, so
with one healthy shard nothing is ejected and with two at most one is. ``percent == 0`` disables ejection.
If the healthy set later shrinks to ejected shards only, the selector routes to them anyway (Envoy's panic
mode): probes say they are healthy, and a run with somewhere to go beats a run waiting for nothing. Each is then
taken as on trial (one attempt at a time, doubling as above), so a shard answering 503 at once cannot draw the
first attempt of every prompt by always having the fewest in flight; and the first of them to complete an attempt
started after its ejection is restored (:meth:`EjectionTracker.restore_served`), which ends panic mode. A trial's
room counts only the attempts started on trial: those from before the ejection prove nothing about the shard now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

__all__ = ["TRIAL_OUTLIVES", "Ejection", "EjectionTracker", "max_ejectable"]

TRIAL_OUTLIVES = 4.0
"""A trial attempt in flight this many times as long as the failure that took its shard out admits the next one.

A shard still failing answers its trial attempt about as fast as it answered the failure (a 503 burst answers in
milliseconds), so an attempt that has run several times longer is doing work: a margin of a few times that duration
tells the two apart despite jitter, and stays far below a generation's length, so a recovered shard is back to full
load before its first success."""
_MAX_DOUBLINGS = 20
"""Bounds the doubling of a trial's room: by then the room exceeds any concurrency a run allows (about a million)."""
_MAX_ROOM = 1 << _MAX_DOUBLINGS


def max_ejectable(healthy: int, percent: float) -> int:
    """How many of ``healthy`` shards may be ejected at once under the panic rule."""
    if healthy < 2 or percent <= 0:
        return 0
    return min(healthy - 1, max(1, math.floor(healthy * percent / 100)))


@dataclass(frozen=True, slots=True)
class Ejection:
    """A shard taken out of rotation until ``until`` (monotonic seconds); ``count`` ejections in a row."""

    shard: str
    until: float
    seconds: float
    count: int


@dataclass(slots=True)
class _Record:
    count: int = 0
    until: float | None = None
    """Monotonic end of the current ejection; None when the shard is in rotation."""
    ejected_wall: float = 0.0
    restored_at: float = -math.inf
    trial: bool = False
    """Restored and not yet succeeded: one attempt at a time (see the module docstring)."""
    holds: int = 0
    """Holds in a row since the shard last succeeded."""
    held_until: float | None = None
    """Monotonic end of the hold's backoff, then of its wait for a probe; None when not held."""
    held_wall: float = 0.0
    """Wall-clock time the hold's backoff runs out, compared against probe times."""
    awaiting_probe: bool = False
    """The hold's backoff has run out and it waits for a passing probe (at most the ejection cap)."""
    failed_at: float = -math.inf
    """Monotonic time of the failure that last ejected or held the shard: older successes are stale evidence."""
    took: float = math.inf
    """How long the failure that last ejected or held the shard took to come back."""


class EjectionTracker:
    """Which shards this runtime has ejected, and when they return."""

    def __init__(
        self,
        base_seconds: float,
        max_seconds: float,
        max_percent: float,
        *,
        probe_grace: Callable[[int], float] | None = None,
    ) -> None:
        if base_seconds <= 0 or max_seconds < base_seconds:
            raise ValueError(f"need 0 < base_seconds <= max_seconds, got {base_seconds} and {max_seconds}")
        self._probe_grace = probe_grace or (lambda count: 0.0)
        self._base = base_seconds
        self._max = max_seconds
        self._percent = max_percent
        self._records: dict[str, _Record] = {}
        self._ejected: set[str] = set()
        self._held: set[str] = set()
        self._probed: set[str] = set()
        """Shards some probe has reported on: their holds end on a passing probe, not on the backoff alone."""

    @property
    def ejected(self) -> frozenset[str]:
        return frozenset(self._ejected)

    def is_ejected(self, name: str) -> bool:
        return name in self._ejected

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def is_held(self, name: str) -> bool:
        return name in self._held

    def on_trial(self, name: str) -> bool:
        """Whether ``name`` returned from an ejection and has not succeeded since: it may take one attempt at a time."""
        record = self._records.get(name)
        return record is not None and record.trial

    def trial_room(self, name: str, *, since: float, now: float) -> tuple[int, float | None]:
        """Attempts ``name`` may have in flight on trial at ``now``, its first trial attempt having started at
        ``since`` (one, doubling every :data:`TRIAL_OUTLIVES` times the failure that took it out), and when that
        next doubles (None: never)."""
        record = self._records.get(name)
        spacing = TRIAL_OUTLIVES * record.took if record is not None else math.inf
        if spacing == math.inf:
            return 1, None
        if spacing <= 0:
            return _MAX_ROOM, None
        periods = int((now - since) / spacing + 1e-9)  # a time computed as a multiple of the spacing counts in full
        return 1 << min(_MAX_DOUBLINGS, periods), since + spacing * (periods + 1)

    def served(self, name: str, *, started: float) -> None:
        """``name`` completed an attempt that started at ``started``: its trial (if any) is over and its holds in a row
        start again, unless the attempt started before the failure that put the shard out (stale evidence)."""
        record = self._records.get(name)
        if record is not None and started >= record.failed_at:
            record.trial = False
            record.holds = 0

    def restore_served(self, name: str, *, started: float, now: float) -> bool:
        """``name``, ejected, completed an attempt that started after its ejection (only panic mode sends attempts to
        an ejected shard): restore it (on trial, which the success then ends, see :meth:`served`). Return whether it
        was restored."""
        record = self._records.get(name)
        if name not in self._ejected or record is None or started < record.failed_at:
            return False
        self._restore(name, now)
        return True

    def hold(
        self, name: str, *, now: float, wall: float, schedule: Callable[[int], float], took: float = math.inf
    ) -> float | None:
        """Hold ``name`` after a failure at ``now`` (``wall``) for which :meth:`eject` refused it: at least
        ``schedule(n)`` seconds for the n-th hold in a row, then until a passing probe if probes report on it. Return
        the seconds, or None if it is ejected or held already, ejection is disabled or the hold would be empty."""
        if name in self._ejected or name in self._held or self._percent <= 0:
            return None
        record = self._records.setdefault(name, _Record())
        seconds = schedule(record.holds + 1)
        if seconds <= 0:
            return None
        record.holds += 1
        record.held_until, record.awaiting_probe = now + seconds, False
        record.held_wall = wall + seconds
        record.failed_at, record.took = now, took
        self._held.add(name)
        return seconds

    def eject(
        self, name: str, *, now: float, wall: float, healthy: Collection[str], took: float = math.inf
    ) -> Ejection | None:
        """Eject ``name`` after an infra failure at ``now``; None if it is already out or the panic rule forbids.

        ``wall`` is the wall-clock time of the failure, compared against probe times; ``healthy`` the names
        in the current healthy set; ``took`` how long the failed attempt took (for :meth:`trial_room`).
        """
        if name in self._ejected or name not in healthy:
            return None
        out = sum(1 for shard in healthy if shard in self._ejected)
        if out >= max_ejectable(len(healthy), self._percent):
            return None
        record = self._records.setdefault(name, _Record())
        if now - record.restored_at >= self._max:
            record.count = 0
        record.count += 1
        seconds = self._duration(record.count)
        record.until = now + seconds
        record.ejected_wall = wall
        record.failed_at, record.took = now, took
        record.trial = False
        record.held_until = None
        self._held.discard(name)
        self._ejected.add(name)
        return Ejection(shard=name, until=record.until, seconds=seconds, count=record.count)

    def _duration(self, count: int) -> float:
        if count > 64:  # 2 ** 64 * base exceeds any sane cap; avoid float overflow on absurd counts
            return self._max
        return float(min(self._max, self._base * 2 ** (count - 1)))

    def expire(self, now: float) -> list[str]:
        """Return (and restore) the shards whose ejection time has run out by ``now``; release (on trial) the holds
        that have, without returning them (a hold is no ejection to report)."""
        for name in list(self._held):
            record = self._records[name]
            if record.held_until is not None and record.held_until <= now:
                if name in self._probed and not record.awaiting_probe:
                    # A probe comes every period; if none passes within the ejection cap, the hold ends anyway.
                    record.held_until, record.awaiting_probe = now + self._max, True
                else:
                    self._release(name)
        done = [name for name in self._ejected if (until := self._records[name].until) is not None and until <= now]
        for name in done:
            self._restore(name, now)
        return sorted(done)

    def probes_succeeded(self, probe_ok_at: Mapping[str, float], now: float) -> list[str]:
        """Return (and restore) the ejected shards with a successful probe strictly after their ejection, and at
        least its probe grace after it; release (on trial) the held shards with a successful probe past their
        backoff."""
        self._probed.update(probe_ok_at)
        for name in list(self._held):
            if (ok := probe_ok_at.get(name)) is not None and ok >= self._records[name].held_wall:
                self._release(name)
        done = [
            name
            for name in self._ejected
            if (ok := probe_ok_at.get(name)) is not None
            and ok > (record := self._records[name]).ejected_wall
            and ok >= record.ejected_wall + self._probe_grace(record.count)
        ]
        for name in done:
            self._restore(name, now)
        return sorted(done)

    def next_expiry(self) -> float | None:
        """The earliest ``until`` among ejected shards, for the caller's timer."""
        times = [u for name in self._ejected if (u := self._records[name].until) is not None]
        times.extend(u for name in self._held if (u := self._records[name].held_until) is not None)
        return min(times) if times else None

    def _release(self, name: str) -> None:
        record = self._records[name]
        record.held_until, record.awaiting_probe, record.trial = None, False, True
        self._held.discard(name)

    def _restore(self, name: str, now: float) -> None:
        record = self._records[name]
        record.until = None
        record.restored_at = now
        record.trial = True
        self._ejected.discard(name)
