"""A run: one batch of prompts going through the dispatcher, and its lifecycle.

The run starts its workers and stall watchdog when first iterated, hands each prompt's outcome out once, ends or
fails, and on close cancels and awaits everything it started. It counts through its :class:`Accounts` only. What it
needs of the dispatcher is the narrow :class:`RunHost`: the policy and clock, a worker's loop, and two notices (a
prompt left without an outcome, the run closed). The dispatcher decides each attempt; the run keeps the prompts.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeVar

from rollout_runtime.dispatch import blame
from rollout_runtime.dispatch.accounts import Accounts
from rollout_runtime.dispatch.budget import PromptBudget
from rollout_runtime.dispatch.clock import Clock
from rollout_runtime.dispatch.drops import DropCounts, DropKind, FailRun, ReplaceDecision, decide_drop
from rollout_runtime.dispatch.outcomes import Completed, DataFailed, Outcome, PromptId, Skipped
from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.dispatch.watchdog import StallVerdict, StallWatchdog, watch
from rollout_runtime.failures import (
    RolloutBatchTooSmall,
    RolloutDataFailure,
    RolloutRedispatchExhausted,
    RolloutStall,
)
from rollout_runtime.shards.model import Shard

__all__ = ["INITIAL_WORKERS", "DispatchRun", "PromptState", "ReadyQueue", "Rollout", "RunHost", "reserve_prompt_ids"]

log = logging.getLogger("rollout_runtime.dispatch")

P = TypeVar("P")
R = TypeVar("R")
Rollout = Callable[[Shard, P], Awaitable[R]]
"""``rollout(shard, prompt)``: one attempt of one prompt on one shard; raise to fail it."""

INITIAL_WORKERS: Final[int] = 64
"""Workers a run starts with; each attempt that reaches a shard starts one more, up to the concurrency limit. A
worker is only created when an attempt shows there is a shard to run on, so with no shard a run of any size holds
this many, not one per prompt; and the first wave of attempts needs no shard to answer before it grows."""


class RunHost(Protocol):
    """What a run needs of the dispatcher that runs its attempts."""

    @property
    def policy(self) -> DispatchPolicy: ...

    @property
    def clock(self) -> Clock: ...

    async def work(self, run: DispatchRun[Any, Any]) -> None:
        """A worker: take the run's ready prompts one at a time and attempt each, while the run is active."""
        ...

    def forget(self, prompt_id: PromptId) -> None:
        """The prompt left the run without an outcome: whatever was learnt about it is no longer needed."""
        ...

    def closed(self, run: DispatchRun[Any, Any]) -> None:
        """The run stopped every task it started."""
        ...

    async def wait_ready(self, min_shards: int = 1, timeout: float | None = None) -> tuple[str, ...]:  # noqa: ASYNC109
        """Wait until at least ``min_shards`` shards are routable; return their names."""
        ...


@dataclass(slots=True, eq=False)
class PromptState:
    """One prompt of a run: what it has spent and where it has been, until it has its one outcome."""

    prompt_id: PromptId
    prompt: Any
    budget: PromptBudget = field(default_factory=PromptBudget)
    tried: list[str] = field(default_factory=list)
    last_failed: str | None = None
    done: bool = False
    data_charges: list[tuple[str, blame.Signature]] = field(default_factory=list)
    """Data failures that carried an HTTP status, by shard and signature: one from a shard later judged sick no
    longer counts against the prompt."""
    stale_versions: dict[int | None, int] = field(default_factory=dict)
    """Answers not committed because of their weights (stale attempts), by the version they came from."""
    position: int = 0
    """The batch position it fills: its own index, or for a replacement the position of the prompt it replaces."""


class ReadyQueue(asyncio.Queue["PromptState | None"]):
    """Prompts waiting for a worker: one coming back for another attempt (a retry after its backoff, or an eviction)
    goes before every fresh prompt, in the order they came back; fresh prompts (and end markers) keep theirs.

    Otherwise a retry waits for the whole rest of the batch to be started, so a prompt's latency after one failure
    grows with the batch size instead of with its backoff. Uses asyncio.Queue's subclassing hooks (``_init``,
    ``_put``, ``_get``, as LifoQueue and PriorityQueue do), so waiting and waking stay asyncio's.
    """

    def _init(self, maxsize: int) -> None:
        self._queue: collections.deque[PromptState | None] = collections.deque()
        self._again: collections.deque[PromptState] = collections.deque()

    def _put(self, item: PromptState | None) -> None:
        if item is not None and item.budget.attempts:
            self._again.append(item)
        else:
            self._queue.append(item)

    def _get(self) -> PromptState | None:
        return self._again.popleft() if self._again else self._queue.popleft()

    def qsize(self) -> int:
        return len(self._queue) + len(self._again)

    def empty(self) -> bool:
        return not self._queue and not self._again


class _End:
    pass


_END = _End()


@dataclass(frozen=True, slots=True)
class _RunFailed:
    error: BaseException


def reserve_prompt_ids(
    policy: DispatchPolicy,
    size: int,
    spares: Sequence[Any],
    prompt_ids: Sequence[PromptId] | None,
    reserve_ids: Sequence[PromptId] | None,
) -> Sequence[PromptId]:
    """The reserve's prompt ids, after checking the reserve against the policy (a clear error for each misuse)."""
    if policy.on_dropped_prompt != "replace":
        if spares:
            raise ValueError("a reserve is drawn on only with on_dropped_prompt='replace'; set it, or pass no reserve")
        return ()
    if len(spares) < policy.replacement_reserve_prompts:
        raise ValueError(
            f"on_dropped_prompt='replace' needs a reserve of at least replacement_reserve_prompts="
            f"{policy.replacement_reserve_prompts} prompt(s), got {len(spares)}: pass reserve=[...] to run()"
        )
    if reserve_ids is None:
        if prompt_ids is not None:
            raise ValueError("with prompt_ids, also pass reserve_ids (one per reserve prompt)")
        return range(size, size + len(spares))
    if len(reserve_ids) != len(spares):
        raise ValueError(f"got {len(reserve_ids)} reserve_ids for {len(spares)} reserve prompts")
    return reserve_ids


class DispatchRun(Generic[P, R]):
    """One batch of prompts going through the dispatcher: an async iterator of outcomes.

    Iterate it (``async for outcome in run``); it ends when every prompt has an outcome, or raises the
    run-terminal error. ``stats`` is live. Use ``async with`` (or ``aclose()``) to stop a run early;
    otherwise leaving the dispatcher stops it.

    The run owns its lifecycle: it starts its workers and watchdog when first iterated, hands each prompt's outcome
    out once, ends or fails, and on close cancels and awaits everything it started. The dispatcher owns the fleet
    and runs the attempts.
    """

    def __init__(
        self,
        host: RunHost,
        accounts: Accounts,
        states: list[PromptState],
        rollout: Rollout[P, R],
        reserve: Iterable[tuple[PromptId, P]] = (),
    ) -> None:
        self._host = host
        self.accounts = accounts
        self.states = states
        self.rollout = rollout
        self.stats = accounts.stats
        self.stats.submitted = len(states)
        self.size = len(states)
        """The batch size: the prompts the run was given (replacements refill positions, they add none)."""
        self.reserve: collections.deque[tuple[PromptId, P]] = collections.deque(reserve)
        self.lost = 0
        """Batch positions given up on and not refilled."""
        self.replaced: collections.Counter[int] = collections.Counter()
        """Replacements drawn per batch position."""
        self.drop_rules = True
        """Whether NeMo-RL's drop allowances apply (a training step); see :meth:`Dispatcher.run`."""
        self.ready: asyncio.Queue[PromptState | None] = ReadyQueue()
        self.outcomes: asyncio.Queue[Outcome[P, R] | _End | _RunFailed] = asyncio.Queue()
        self.workers: list[asyncio.Task[None]] = []
        self.worker_limit = 0
        self.watchdog_task: asyncio.Task[None] | None = None
        self.timers: set[asyncio.TimerHandle] = set()
        self.error: BaseException | None = None
        self.started = False
        self.closed = False
        self._stopped = asyncio.Event()
        self._delivered = False

    @property
    def active(self) -> bool:
        return not self.closed and self.error is None

    def aborted_ids(self) -> list[PromptId]:
        """Prompts that had no outcome when the run raised or was closed early."""
        return [s.prompt_id for s in self.states if not s.done]

    def __aiter__(self) -> AsyncIterator[Outcome[P, R]]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[Outcome[P, R]]:
        """The outcomes; leaving early (``break``, a cancelled or failing consumer) closes the run, so attempts in
        flight are cancelled and undelivered outcomes count as aborted, without ``aclose()`` by hand."""
        try:
            while True:
                try:
                    item = await self.__anext__()
                except StopAsyncIteration:
                    return
                yield item
        finally:
            await self.aclose()

    async def __anext__(self) -> Outcome[P, R]:
        if self._delivered:
            raise StopAsyncIteration
        if not self.started:
            self._start()
        item = await self.outcomes.get()
        if isinstance(item, _End):
            self._delivered = True
            await self.aclose()
            raise StopAsyncIteration
        if isinstance(item, _RunFailed):
            self._delivered = True
            await self.aclose()
            raise item.error
        return item

    async def __aenter__(self) -> DispatchRun[P, R]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- lifecycle ------------------------------------------------------------------------------------------

    def _start(self) -> None:
        self.started = True
        if not self.states:
            self.outcomes.put_nowait(_END)
            return
        for state in self.states:
            self.ready.put_nowait(state)
        self.accounts.run_started()
        policy = self._host.policy
        self.worker_limit = len(self.states)
        if policy.max_concurrency is not None:
            self.worker_limit = min(self.worker_limit, policy.max_concurrency)
        for _ in range(min(self.worker_limit, INITIAL_WORKERS)):
            self._spawn_worker()
        self._start_watchdog()

    def _start_watchdog(self) -> None:
        """Watch the run for stalls (nothing committed for ``stall_deadline_seconds``), from now on."""
        policy, clock = self._host.policy, self._host.clock.monotonic
        watchdog = StallWatchdog(policy.stall_deadline_seconds, policy.stall_action, now=clock())
        self.accounts.watchdog = watchdog
        self.watchdog_task = asyncio.create_task(
            watch(
                watchdog,
                check_seconds=policy.stall_check_seconds,
                clock=clock,
                unfinished=lambda: self.stats.unfinished,
                on_stall=self._stalled,
            ),
            name="rollout-dispatch-watchdog",
        )

    def _spawn_worker(self) -> None:
        name = f"rollout-dispatch-worker-{len(self.workers)}"
        self.workers.append(asyncio.create_task(self._host.work(self), name=name))

    def grow(self) -> None:
        """An attempt reached a shard: start one more worker while prompts wait and the concurrency limit allows."""
        if self.active and len(self.workers) < self.worker_limit and not self.ready.empty():
            self._spawn_worker()

    def finish(self, state: PromptState, outcome: Outcome[P, R]) -> None:
        """Hand out the prompt's one outcome (counted first); after the last one, end the run."""
        self.accounts.prompt_ended(outcome, state.stale_versions)
        state.done = True
        self.outcomes.put_nowait(outcome)
        if self.stats.unfinished == 0:
            self.outcomes.put_nowait(_END)
            for _ in self.workers:
                self.ready.put_nowait(None)

    def give_up(
        self,
        state: PromptState,
        drops: DropCounts,
        kind: DropKind,
        outcome: DataFailed[Any] | Skipped[Any],
        exc: BaseException | None,
    ) -> None:
        """A budget ran out: report the prompt (and refill its batch position), or end the run; ``drops`` counts the
        prompts given up on over every run (see ``drops``)."""
        if not self.drop_rules:
            self.finish(state, outcome)  # an independent request: its outcome is the whole answer
            return
        decision = decide_drop(
            self._host.policy,
            drops,
            kind,
            size=self.size,
            lost=self.lost,
            replaced=self.replaced[state.position],
            reserve_left=len(self.reserve),
        )
        if isinstance(decision, FailRun):
            if kind == "infra":
                what = f"failed {state.budget.infra_failures} infra attempt(s) on shards {list(outcome.shards)}"
            else:
                what = f"data-failed after {outcome.attempts} attempt(s)"
            text = f"prompt {state.prompt_id!r} {what}; last: {outcome.reason}; {decision.message}"
            error: Exception
            if decision.rule == "max_skipped_prompts":
                error = RolloutDataFailure(text)
            elif decision.rule == "max_consecutive_dropped_prompts":
                error = RolloutRedispatchExhausted(text)
            else:
                error = RolloutBatchTooSmall(text)
            error.__cause__ = exc
            log.error("%s", error)
            self.fail(error)
            return
        if kind == "data":
            drops.skipped_prompts += 1
        else:
            drops.consecutive_dropped_prompts += 1
        if isinstance(decision, ReplaceDecision):
            self.replace(state)
        else:
            self.lost += 1
        self.finish(state, outcome)

    def replace(self, state: PromptState) -> None:
        """Submit the next reserve prompt in ``state``'s batch position (before ``state``'s outcome, so the run
        cannot end in between)."""
        prompt_id, prompt = self.reserve.popleft()
        self.replaced[state.position] += 1
        fresh = PromptState(prompt_id=prompt_id, prompt=prompt, position=state.position)
        self.states.append(fresh)
        self.stats.submitted += 1
        log.info("prompt %s replaces prompt %s in batch position %d", prompt_id, state.prompt_id, state.position)
        self.ready.put_nowait(fresh)

    def unsent(self, state: PromptState) -> None:
        """The prompt goes back at once without having been attempted (its shard left the fleet while it waited for
        room there): not a redispatch, since no attempt failed."""
        self.ready.put_nowait(state)

    def requeue(self, state: PromptState, delay: float) -> None:
        """Send the prompt back for another attempt, after ``delay`` seconds on a loop timer (not on a worker)."""
        self.accounts.redispatched()
        if delay <= 0:
            self.ready.put_nowait(state)
            return

        def ready_again() -> None:
            self.timers.discard(handle)
            if self.active:
                self.ready.put_nowait(state)

        handle = asyncio.get_running_loop().call_later(delay, ready_again)
        self.timers.add(handle)

    def fail_prompt(self, state: PromptState, error: BaseException) -> None:
        """A run-terminal error found on ``state``'s attempt (no routable shard for a healthy wait, a misconfigured
        fleet): the run ends with it (a session may instead hand it to that prompt alone)."""
        self.fail(error)

    def fail(self, error: BaseException) -> None:
        """End the run with ``error``: outcomes already queued are still delivered, then it raises."""
        if not self.active:
            return
        self.error = error
        self.stats.aborted += self.stats.unfinished
        self.outcomes.put_nowait(_RunFailed(error))
        self._stop_tasks()

    async def aclose(self) -> None:
        """Stop the run: cancel and await its workers, watchdog and timers; unfinished prompts count aborted."""
        if self.closed:
            return
        self.closed = True
        self._abort_undelivered()
        unfinished = self.stats.unfinished
        self.stats.aborted += unfinished
        if self.error is None and unfinished:
            # Wake a consumer still iterating (the dispatcher is closing under it): never a silent, short end.
            self.outcomes.put_nowait(_RunFailed(RuntimeError(f"run closed with {unfinished} unfinished prompt(s)")))
        stopped = self._stop_tasks()
        await asyncio.gather(*stopped, return_exceptions=True)
        for state in self.states:
            if not state.done:  # a later run may reuse the ids: its prompts start with no evidence
                self._host.forget(state.prompt_id)
        self._host.closed(self)
        self._stopped.set()

    async def wait_closed(self) -> None:
        """Wait until the run has stopped every task it started (after its end, ``aclose()``, or a consumer that
        left the ``async for`` early, which closes it on the loop's next turns)."""
        await self._stopped.wait()

    def _abort_undelivered(self) -> None:
        """Outcomes queued but never handed to the consumer are aborted, not completed: nobody received them."""
        undelivered: list[Outcome[P, R]] = []
        markers: list[_End | _RunFailed] = []
        while not self.outcomes.empty():
            item = self.outcomes.get_nowait()
            (markers if isinstance(item, _End | _RunFailed) else undelivered).append(item)  # type: ignore[arg-type]
        if undelivered:
            states = {state.prompt_id: state for state in self.states}
            stats = self.stats
            for outcome in undelivered:
                if isinstance(outcome, Completed):
                    stats.completed -= 1
                elif isinstance(outcome, DataFailed):
                    stats.data_failed -= 1
                else:
                    stats.skipped -= 1
                states[outcome.prompt_id].done = False
        for marker in markers:
            self.outcomes.put_nowait(marker)

    def _stop_tasks(self) -> list[asyncio.Task[None]]:
        """Cancel the timers and every task of this run but the calling one; return the tasks cancelled."""
        for handle in self.timers:
            handle.cancel()
        self.timers.clear()
        current = asyncio.current_task()
        tasks = [t for t in (*self.workers, self.watchdog_task) if t is not None and t is not current]
        for task in tasks:
            task.cancel()
        return tasks

    def _stalled(self, verdict: StallVerdict) -> None:
        self.accounts.stalled(verdict)
        log.warning("%s", verdict.message())
        if verdict.action == "abort":
            self.fail(RolloutStall(verdict.message()))
