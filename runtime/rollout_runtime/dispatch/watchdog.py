"""The stall watchdog: prompts unfinished, yet nothing committed within the deadline.

The failure it catches is the one users report most: a trainer that waits for hours on a dead engine. Every
other mechanism (attempt timeouts, probes, budgets) can be misconfigured or defeated by a rollout that never
returns; this one only needs a clock. :class:`StallWatchdog` is the pure decision, :func:`watch` the loop
around it (sleeps on the event loop, so looptime can fast-forward it in tests).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["StallVerdict", "StallWatchdog", "watch"]


@dataclass(frozen=True, slots=True)
class StallVerdict:
    """A stall was detected: nothing committed for ``idle_seconds`` while ``unfinished`` prompts remain."""

    action: Literal["warn", "abort"]
    idle_seconds: float
    unfinished: int

    def message(self) -> str:
        return (
            f"rollout stalled: {self.unfinished} prompt(s) unfinished and none committed for "
            f"{self.idle_seconds:.1f}s (action: {self.action})"
        )


class StallWatchdog:
    """Decides, from commit times and a clock reading, whether the run is stalled.

    A stall is reported once per episode: after a verdict, the next one needs a commit first (and then a
    whole deadline without one), so a "warn" watchdog does not repeat itself every check.
    """

    def __init__(self, deadline_seconds: float, action: Literal["warn", "abort"], *, now: float) -> None:
        if deadline_seconds <= 0:
            raise ValueError(f"deadline_seconds must be > 0, got {deadline_seconds}")
        self.deadline_seconds = deadline_seconds
        self.action: Literal["warn", "abort"] = action
        self._last_commit = now
        self._reported = False

    @property
    def last_commit(self) -> float:
        return self._last_commit

    def committed(self, now: float) -> None:
        """A prompt finished (completed or data-failed): progress, so the episode ends."""
        self._last_commit = now
        self._reported = False

    def check(self, now: float, unfinished: int) -> StallVerdict | None:
        """A verdict if ``unfinished > 0`` and the last commit is at least a deadline old; else None."""
        if unfinished <= 0:
            # Idle, not stalled: the clock restarts when work arrives.
            self._last_commit = now
            self._reported = False
            return None
        idle = now - self._last_commit
        if self._reported or idle < self.deadline_seconds:
            return None
        self._reported = True
        return StallVerdict(action=self.action, idle_seconds=idle, unfinished=unfinished)


async def watch(
    watchdog: StallWatchdog,
    *,
    check_seconds: float,
    clock: Callable[[], float],
    unfinished: Callable[[], int],
    on_stall: Callable[[StallVerdict], None],
) -> None:
    """Check every ``check_seconds`` until cancelled; hand each verdict to ``on_stall``."""
    while True:
        await asyncio.sleep(check_seconds)
        verdict = watchdog.check(clock(), unfinished())
        if verdict is not None:
            on_stall(verdict)
