"""Per-episode cleanup: bounded, process-local callbacks that release what an episode acquired.

Callbacks:

- are process-local Python objects, although they may issue remote close requests;
- run sequentially in LIFO order (last acquired, first released), each with its own cleanup timeout;
- synchronous ones run in a worker thread (``asyncio.to_thread``), so a blocking release cannot stall the event
  loop; they must not touch the loop's objects (register an ``async`` function for that). A function that returns
  an awaitable has it awaited on the loop, within the same timeout;
- are waited for no longer than their timeout: one that swallows its cancellation, or a thread that keeps
  blocking, is left to finish on its own, logged and counted as a timed-out failure;
- must be idempotent, because a timed-out remote request may have succeeded; each still runs at most once;
- are lost on process or host failure, so remote owners need expiry or reaping.

A failing or timed-out callback never prevents later owners from tearing down their resources. Final unwinding is
shielded from cancellation (a cancelled episode still releases its sandbox) and bounded by the number of
registered callbacks times the per-callback timeout. There is no durable retry after the context is discarded.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["CleanupCallback", "CleanupFailure", "EpisodeCleanupContext"]

log = logging.getLogger(__name__)

CleanupFn = Callable[[], Awaitable[object] | object]


@dataclass(frozen=True)
class CleanupFailure:
    """One callback that raised or overran its timeout; counted, logged, never re-run."""

    name: str
    error_type: str
    message: str
    timed_out: bool


class CleanupCallback:
    """One registered participant's release action. Runs at most once, however often it is asked to."""

    def __init__(self, fn: CleanupFn, name: str) -> None:
        self.name = name
        self._fn = fn
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    async def run_once(self, timeout_seconds: float | None) -> CleanupFailure | None:
        """Run this idempotent callback once; return how it failed, if it did. Cancellation propagates."""
        if self._started:
            return None
        self._started = True
        loop = asyncio.get_running_loop()
        deadline = None if timeout_seconds is None else loop.time() + timeout_seconds
        try:
            if inspect.iscoroutinefunction(self._fn):
                result: object = self._fn()
            else:
                result = await _bounded(asyncio.to_thread(self._fn), deadline, self.name)
            if inspect.isawaitable(result):
                await _bounded(result, deadline, self.name)
        except TimeoutError:
            log.warning("cleanup callback %r timed out after %ss", self.name, timeout_seconds)
            return CleanupFailure(self.name, "TimeoutError", f"timed out after {timeout_seconds}s", timed_out=True)
        except Exception as exc:
            log.warning("cleanup callback %r failed", self.name, exc_info=True)
            return CleanupFailure(self.name, type(exc).__name__, str(exc)[:500], timed_out=False)
        return None


_ABANDONED: set[asyncio.Future[object]] = set()
"""Callbacks that overran their timeout and ignored cancellation: referenced until they end, never awaited."""


async def _bounded(awaitable: Awaitable[object], deadline: float | None, name: str) -> object:
    """Await ``awaitable`` until ``deadline`` (loop time); past it, cancel it and stop waiting (``TimeoutError``).

    Unlike ``asyncio.timeout``, this does not wait for the cancellation to be honoured: a callback that swallows
    it keeps running on its own, and the episode's unwinding moves on.
    """
    future = asyncio.ensure_future(awaitable)
    loop = asyncio.get_running_loop()
    timeout = None if deadline is None else max(0.0, deadline - loop.time())
    try:
        done, _ = await asyncio.wait({future}, timeout=timeout)
    except asyncio.CancelledError:
        _abandon(future, name)
        raise
    if future in done:
        return future.result()
    _abandon(future, name)
    raise TimeoutError


def _abandon(future: asyncio.Future[object], name: str) -> None:
    future.cancel()
    if future.done():
        return
    _ABANDONED.add(future)

    def _ended(f: asyncio.Future[object]) -> None:
        _ABANDONED.discard(f)
        if not f.cancelled() and f.exception() is not None:
            log.warning("abandoned cleanup callback %r failed later: %r", name, f.exception())

    future.add_done_callback(_ended)


class EpisodeCleanupContext:
    """Hold bounded process-local cleanup callbacks for one episode.

    The episode timeout bounds :meth:`close` calls made during the protocol; ``cleanup_timeout_seconds`` bounds
    each callback left for final unwinding (:meth:`aclose`).
    """

    def __init__(self, cleanup_timeout_seconds: float) -> None:
        if cleanup_timeout_seconds <= 0:
            raise ValueError(f"cleanup_timeout_seconds must be positive, got {cleanup_timeout_seconds}")
        self.cleanup_timeout_seconds = cleanup_timeout_seconds
        self._callbacks: list[CleanupCallback] = []
        self._unwinding: asyncio.Task[None] | None = None
        self.failures: list[CleanupFailure] = []

    def register(self, fn: CleanupFn, *, name: str | None = None) -> CleanupCallback:
        """Register a release action (sync or async); returns the handle :meth:`close` takes."""
        if self._unwinding is not None:
            raise RuntimeError("cleanup context is already unwinding; register before the episode ends")
        callback = CleanupCallback(fn, name or str(getattr(fn, "__qualname__", None) or repr(fn)))
        self._callbacks.append(callback)
        return callback

    @property
    def pending(self) -> int:
        """Callbacks registered and not yet run."""
        return sum(1 for c in self._callbacks if not c.started)

    @property
    def bound_seconds(self) -> float:
        """Upper bound of final unwinding: pending callbacks times the per-callback timeout."""
        return self.pending * self.cleanup_timeout_seconds

    async def close(self, callback: CleanupCallback) -> CleanupFailure | None:
        """Close one registered participant at a protocol boundary: run just its callback, once.

        Bounded by the episode's own timeout (the caller's), not the cleanup timeout. A failure is recorded and
        returned, never raised: the protocol decides whether it matters.
        """
        if callback not in self._callbacks:
            raise ValueError(f"cleanup callback {callback.name!r} is not registered with this context")
        failure = await callback.run_once(None)
        if failure is not None:
            self.failures.append(failure)
        return failure

    async def aclose(self) -> list[CleanupFailure]:
        """Run every pending callback in LIFO order; shielded from cancellation, bounded in total.

        If the caller is cancelled meanwhile, unwinding still finishes (it is bounded) and the cancellation is
        re-raised afterwards. Calling it again returns the same failures without running anything twice.
        """
        if self._unwinding is None:
            self._unwinding = asyncio.get_running_loop().create_task(self._unwind(), name="episode-cleanup")
        cancelled = False
        while not self._unwinding.done():
            try:
                await asyncio.shield(self._unwinding)
            except asyncio.CancelledError:
                if self._unwinding.cancelled():  # someone cancelled the unwinding task itself
                    break
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        return list(self.failures)

    async def _unwind(self) -> None:
        for callback in reversed(self._callbacks):
            failure = await callback.run_once(self.cleanup_timeout_seconds)
            if failure is not None:
                self.failures.append(failure)
