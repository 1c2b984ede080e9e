"""The write schedule, pure: which statuses a writer pass writes, in what order, and when the next pass is due.

:mod:`fleet_operator.decisions` says whether a status is worth a write (its stable part changed, or a heartbeat is
due); this module says when to ask, from each object's :class:`WriteState` and the loop time the caller passes in.
The engine (:mod:`fleet_operator.engine`) does the PATCHes.

- **Pass order** (:data:`PASS_ORDER`): targets' transitions, then fleets, then targets' heartbeats. A fleet's
  status is what trainers read: it never waits behind a wave of heartbeat PATCHes.
- **Targets**: a transition is written in the pass that sees it; otherwise a target is looked at again on its
  heartbeat, one ``status_heartbeat_seconds`` after its last write (or after the last check that found nothing new).
- **Fleets**: written ``fleet_coalesce_seconds`` after the first change that dirtied them (a burst of shard
  transitions is one write), and on a heartbeat.
- **Retries**: a failed write is retried after a delay that doubles from ``write_retry_seconds`` up to
  ``_MAX_RETRY_SECONDS`` (30 s); a record waiting for its retry is skipped by every sweep until then.
- **In flight**: one sweep keeps up to :data:`MAX_IN_FLIGHT_WRITES` PATCHes in flight.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from fleet_operator.decisions import status_needs_write

__all__ = ["MAX_IN_FLIGHT_WRITES", "PASS_ORDER", "Sweep", "TargetWrite", "WriteSchedule", "WriteState", "retry_delay"]

_MAX_RETRY_SECONDS: Final[float] = 30.0
MAX_IN_FLIGHT_WRITES: Final[int] = 16
"""Status PATCHes one writer sweep keeps in flight: at 1,000 targets a sequential sweep takes minutes on a busy
apiserver (bench/operator_scale.py), and a fleet's status must never wait that long."""


class Sweep(enum.Enum):
    """One step of a writer pass."""

    TRANSITIONS = "transitions"
    """Targets whose stable status part changed."""
    FLEETS = "fleets"
    """Fleets whose coalescing window closed or whose heartbeat is due."""
    HEARTBEATS = "heartbeats"
    """Targets whose heartbeat is due (and any transition that arrived during the fleets step)."""


PASS_ORDER: Final[tuple[Sweep, ...]] = (Sweep.TRANSITIONS, Sweep.FLEETS, Sweep.HEARTBEATS)


class TargetWrite(enum.Enum):
    """What a sweep does with one target."""

    NOTHING = "nothing"
    WRITE = "write"
    CHECKED = "checked"
    """Its heartbeat was due but nothing changed: counts as written now, so the next look is a heartbeat away."""


def _compact(status: Mapping[str, Any]) -> dict[str, Any]:
    """A status as the API server keeps it after a merge patch: keys with null values are absent."""
    return {k: v for k, v in status.items() if v is not None}


def retry_delay(previous: float, base: float) -> float:
    """The delay before the next retry: ``base`` first, then doubling, at most ``_MAX_RETRY_SECONDS``."""
    return min(_MAX_RETRY_SECONDS, max(base, previous * 2))


@dataclass
class WriteState:
    """What the writer remembers of one object: the last status it wrote (or found) and when, and its retry."""

    written: dict[str, Any] | None = None
    written_at: float = float("-inf")
    """Loop time the status was last written, or last found current on a heartbeat check."""
    retry_at: float = float("-inf")
    retry_delay: float = 0.0

    def found(self, persisted: Mapping[str, Any], now: float) -> None:
        """A new record starts from the status the object already has (none: it is written at once)."""
        if persisted:
            self.written, self.written_at = _compact(persisted), now

    def needs_write(self, desired: Mapping[str, Any], volatile: frozenset[str], *, heartbeat_due: bool) -> bool:
        return status_needs_write(self.written, _compact(desired), volatile, heartbeat_due=heartbeat_due)

    def retrying(self, now: float) -> bool:
        """Waiting for a retry: sweeps skip it until ``retry_at``."""
        return self.retry_at > now

    def succeeded(self, desired: Mapping[str, Any], now: float) -> None:
        self.written, self.written_at = _compact(desired), now
        self.retry_at, self.retry_delay = float("-inf"), 0.0

    def failed(self, now: float, base_delay: float) -> float:
        """Schedule the retry of a failed write; the delay chosen."""
        self.retry_delay = retry_delay(self.retry_delay, base_delay)
        self.retry_at = now + self.retry_delay
        return self.retry_delay


@dataclass(frozen=True)
class WriteSchedule:
    """The writer's timing settings and the decisions that use them."""

    heartbeat_seconds: float
    coalesce_seconds: float
    retry_seconds: float

    def heartbeat_due(self, state: WriteState, now: float) -> bool:
        return now - state.written_at >= self.heartbeat_seconds

    def target_write(
        self, state: WriteState, desired: Mapping[str, Any], volatile: frozenset[str], now: float, *, sweep: Sweep
    ) -> TargetWrite:
        """A target's turn in a sweep: write it (a transition, or a due heartbeat with news), mark it checked, or
        leave it. Only the heartbeat sweep writes the volatile part."""
        due = sweep is Sweep.HEARTBEATS and self.heartbeat_due(state, now)
        if state.needs_write(desired, volatile, heartbeat_due=due):
            return TargetWrite.WRITE
        return TargetWrite.CHECKED if due else TargetWrite.NOTHING

    def target_next_due(self, state: WriteState) -> float:
        """When a target looked at in the heartbeat sweep wants the next pass: its heartbeat, or its retry."""
        return max(state.written_at + self.heartbeat_seconds, state.retry_at)

    def fleet_wait(self, state: WriteState, dirty_since: float | None, now: float) -> float | None:
        """None: a fleet's turn has come (its coalescing window closed, or its heartbeat is due); otherwise the loop
        time to look again."""
        if state.retrying(now):
            return state.retry_at
        coalesce_until = (dirty_since + self.coalesce_seconds) if dirty_since else None
        if coalesce_until is not None and coalesce_until > now:
            return coalesce_until
        if coalesce_until is None and not self.heartbeat_due(state, now):
            return state.written_at + self.heartbeat_seconds
        return None

    def fleet_next_due(self, state: WriteState, now: float) -> float:
        """After a fleet's turn: its retry, or its next heartbeat."""
        return state.retry_at if state.retrying(now) else now + self.heartbeat_seconds
