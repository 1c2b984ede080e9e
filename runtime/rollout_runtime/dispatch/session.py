"""The online API: a long-lived :class:`DispatchSession` that takes prompts one at a time.

A trainer loop or an agent that issues one request at a time submits into a session instead of starting a run
per prompt: budgets, the stall watchdog, ejection state, per-shard timings and stats are shared across every
submission. The session is a :class:`~rollout_runtime.dispatch.run.DispatchRun` whose prompts arrive over time
and whose outcomes go to each submitter's future instead of one iterator, so the batch ``run()`` and the session
share one core (workers, attempts, requeueing, accounting).

::

    async with Dispatcher(source, policy) as dispatcher, dispatcher.session(rollout) as session:
        await session.wait_ready(min_shards=2, timeout=60)
        outcome = await session.submit(prompt)

Invariant: every submitted prompt's future resolves exactly once, to its outcome, or raises the error that ended
the session (or, with ``on_prompt_error="fail_prompt"``, the run-terminal error found on its own attempt; counted
``aborted`` in ``stats``), so ``submitted == completed + data_failed + skipped + aborted``
once the session is closed.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Final, Generic, Literal, TypeVar

from rollout_runtime.dispatch.accounts import Accounts
from rollout_runtime.dispatch.outcomes import Outcome, PromptId
from rollout_runtime.dispatch.run import DispatchRun, PromptState, Rollout, RunHost

__all__ = ["DEFAULT_SESSION_CONCURRENCY", "DispatchSession", "SessionClosed"]

P = TypeVar("P")
R = TypeVar("R")

DEFAULT_SESSION_CONCURRENCY: Final[int] = 1024
"""Attempts in flight at once in a session whose policy leaves ``max_concurrency`` unset. A session has no batch size
to bound its workers by, so this bounds the worker tasks it holds; it is above what a fleet of shards with continuous
batching serves at once, so it limits memory, never throughput."""


class SessionClosed(RuntimeError):
    """A prompt was submitted to (or still pending in) a session that has been closed."""


class DispatchSession(DispatchRun[P, R], Generic[P, R]):
    """Prompts submitted one at a time, sharing one run's budgets, watchdog and stats; see the module docstring."""

    def __init__(
        self,
        host: RunHost,
        accounts: Accounts,
        rollout: Rollout[P, R],
        *,
        on_prompt_error: Literal["end_session", "fail_prompt"] = "end_session",
    ) -> None:
        super().__init__(host, accounts, [], rollout)
        self.on_prompt_error = on_prompt_error
        """``"fail_prompt"``: a run-terminal error found on one prompt's attempt ends that prompt only (its future
        raises it, counted ``aborted``); see :meth:`Dispatcher.session`."""
        self._pending: dict[PromptId, tuple[PromptState, asyncio.Future[Outcome[P, R]]]] = {}
        self._ids = itertools.count()
        self._aborted: list[PromptId] = []
        limit = host.policy.max_concurrency
        self.concurrency = limit if limit is not None else DEFAULT_SESSION_CONCURRENCY
        self._start_session()

    def _start_session(self) -> None:
        self.started = True
        self.accounts.run_started()
        self._start_watchdog()

    # -- the online API ---------------------------------------------------------------------------------------

    def submit(self, prompt: P, *, prompt_id: PromptId | None = None) -> asyncio.Future[Outcome[P, R]]:
        """Queue ``prompt``; the returned future resolves to its one outcome (or raises the session's error).

        Ids default to 0, 1, 2... in submission order; an id still pending in this session is refused. At most
        ``concurrency`` attempts run at once; further prompts wait in the ready queue (retries go first).
        """
        if self.error is not None:
            raise self.error
        if self.closed:
            raise SessionClosed("submit() on a closed session: open a new one with dispatcher.session(rollout)")
        if prompt_id is None:
            prompt_id = next(self._ids)
            while prompt_id in self._pending:
                prompt_id = next(self._ids)
        elif prompt_id in self._pending:
            raise ValueError(f"prompt id {prompt_id!r} is still pending in this session: ids must be unique")
        state = PromptState(prompt_id=prompt_id, prompt=prompt)
        future: asyncio.Future[Outcome[P, R]] = asyncio.get_running_loop().create_future()
        if self.stats.unfinished == 0 and self.accounts.watchdog is not None:
            self.accounts.watchdog.committed(self._host.clock.monotonic())  # idle until now, not stalled
        self._pending[prompt_id] = (state, future)
        self.stats.submitted += 1
        self.ready.put_nowait(state)
        if len(self.workers) < min(self.concurrency, self.stats.unfinished):
            self._spawn_worker()
        return future

    async def wait_ready(self, min_shards: int = 1, timeout: float | None = None) -> tuple[str, ...]:  # noqa: ASYNC109
        """Wait until at least ``min_shards`` shards are routable (see :meth:`Dispatcher.wait_ready`)."""
        return await self._host.wait_ready(min_shards, timeout)

    @property
    def pending(self) -> int:
        """Submitted prompts without an outcome yet."""
        return len(self._pending)

    # -- the run's hooks, for prompts that arrive over time ---------------------------------------------------

    def aborted_ids(self) -> list[PromptId]:
        return [*self._aborted, *(s.prompt_id for s, _ in self._pending.values() if not s.done)]

    def finish(self, state: PromptState, outcome: Outcome[P, R]) -> None:
        """Count the outcome, then hand it to the prompt's submitter; the session goes on."""
        self.accounts.prompt_ended(outcome)
        state.done = True
        entry = self._pending.pop(state.prompt_id, None)
        if entry is not None and not entry[1].done():
            entry[1].set_result(outcome)

    def fail_prompt(self, state: PromptState, error: BaseException) -> None:
        """End the session with ``error``, or with ``on_prompt_error="fail_prompt"`` only ``state``'s prompt."""
        if self.on_prompt_error == "end_session":
            super().fail_prompt(state, error)
            return
        if not self.active or state.done:
            return
        state.done = True
        self.stats.aborted += 1
        self._host.forget(state.prompt_id)
        entry = self._pending.pop(state.prompt_id, None)
        if entry is not None and not entry[1].done():
            entry[1].set_exception(error)
            entry[1].exception()  # a submitter that stopped waiting must not leave "exception never retrieved"

    def fail(self, error: BaseException) -> None:
        """End the session with ``error``: every pending submitter gets it."""
        if not self.active:
            return
        super().fail(error)
        self._reject_pending(error)

    async def aclose(self) -> None:
        """Stop the session: pending prompts are aborted and their futures raise :class:`SessionClosed`."""
        if self.closed:
            return
        pending = len(self._pending)
        self.closed = True
        self.stats.aborted += self.stats.unfinished
        stopped = self._stop_tasks()
        await asyncio.gather(*stopped, return_exceptions=True)
        self._reject_pending(SessionClosed(f"session closed with {pending} prompt(s) pending"))
        self._host.closed(self)

    def _reject_pending(self, error: BaseException) -> None:
        for state, future in self._pending.values():
            if not state.done:
                self._aborted.append(state.prompt_id)
            if not future.done():
                future.set_exception(error)
                future.exception()  # a submitter that stopped waiting must not leave "exception never retrieved"
        self._pending.clear()

    async def __aenter__(self) -> DispatchSession[P, R]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
