"""Admission: at most N episodes run at once, at most Q wait for a slot, and none waits forever.

Rejection and admission timeouts are not terminal: the server is busy, not the request bad, so the runtime
redispatches the episode (to this server later, or to another).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["AdmissionLimiter", "AdmissionRejected"]


class AdmissionRejected(Exception):
    """No slot for this episode: the queue was full (``timed_out`` False) or the wait ran out (True)."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class AdmissionLimiter:
    """A concurrency limit with a bounded, timed admission queue. ``max_concurrent=None`` admits everything."""

    def __init__(self, max_concurrent: int | None, *, max_queued: int, timeout_seconds: float | None) -> None:
        if max_concurrent is not None and timeout_seconds is None:
            raise ValueError("an admission timeout is required once concurrency is limited")
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.timeout_seconds = timeout_seconds
        self._slots = asyncio.Semaphore(max_concurrent) if max_concurrent is not None else None
        self.running = 0
        self.queued = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot for the body; raise :class:`AdmissionRejected` without one."""
        await self._acquire()
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            if self._slots is not None:
                self._slots.release()

    async def _acquire(self) -> None:
        if self._slots is None:
            return
        if self._slots.locked() and self.queued >= self.max_queued:
            raise AdmissionRejected(
                f"admission queue is full ({self.queued} waiting for {self.max_concurrent} slots)", timed_out=False
            )
        self.queued += 1
        try:
            async with asyncio.timeout(self.timeout_seconds):
                await self._slots.acquire()
        except TimeoutError:
            raise AdmissionRejected(
                f"no episode slot within the admission timeout of {self.timeout_seconds}s "
                f"({self.max_concurrent} slots busy)",
                timed_out=True,
            ) from None
        finally:
            self.queued -= 1
