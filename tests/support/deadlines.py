"""Local deadlines for tests that wait on events: a hang fails one test, saying what it waited for.

Without one, a wait that never ends is caught only by pytest's session timeout, which kills the whole run with no
summary, skips the later tiers and leaves frozen processes behind. With one, the test fails with a message and its
fixtures tear down (stopping what they started). A deadline guards against a hang; it asserts nothing about speed.

Under looptime, time is simulated: waiting costs nothing, so the guard is long in loop time (tests there simulate
minutes of stall deadlines and backoffs) and a hang still fails at once in real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final, TypeVar

import pytest

__all__ = ["HANG_SECONDS", "deadline", "within"]

T = TypeVar("T")

HANG_SECONDS: Final[float] = 60.0
"""The default guard in real time: far beyond what a healthy wait takes on a loaded CI box, far below the 300 s
session timeout."""

_LOOPTIME_HANG_SECONDS: Final[float] = 24 * 3600.0
"""The default guard in looptime's simulated time, where waiting it out takes no real time."""


def _simulated() -> bool:
    return bool(getattr(asyncio.get_running_loop(), "looptime_on", False))


@asynccontextmanager
async def deadline(waiting_for: str | Callable[[], str], seconds: float | None = None) -> AsyncIterator[None]:
    """Fail the test if the block is still waiting after ``seconds``; ``waiting_for`` says what (a callable is asked
    at the deadline, so the message can show the state the wait got stuck in)."""
    simulated = _simulated()
    limit = seconds if seconds is not None else _LOOPTIME_HANG_SECONDS if simulated else HANG_SECONDS
    guard = asyncio.timeout(limit)
    try:
        async with guard:
            yield
    except TimeoutError:
        if not guard.expired():
            raise  # the code under test timed out by itself: that is its result, not a hang
        what = waiting_for() if callable(waiting_for) else waiting_for
        clock = " of loop time (looptime)" if simulated else ""
        pytest.fail(f"hung: still waiting after {limit:g} s{clock} for {what}")


async def within(awaitable: Awaitable[T], waiting_for: str | Callable[[], str], seconds: float | None = None) -> T:
    """Await ``awaitable`` under :func:`deadline`."""
    async with deadline(waiting_for, seconds):
        return await awaitable
