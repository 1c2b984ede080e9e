"""The dispatcher's two clocks, injectable: monotonic for deadlines and durations, wall for timestamps."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "LoopClock"]


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on the clock the event loop schedules by (deadlines, durations, ejection times)."""
        ...

    def wall(self) -> float:
        """Unix time, for metrics and for comparison with probe times from shard sources."""
        ...


class LoopClock:
    """The running loop's time (fast-forwarded by looptime in tests) and ``time.time``."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.monotonic = (loop or asyncio.get_running_loop()).time
        self.wall = time.time
