"""The dispatcher: keeps rollouts flowing across a changing fleet and accounts for every prompt exactly once.

The loop, per prompt: pick a routable shard (healthy set minus ejected, weighted least outstanding, never
the shard that just failed it) -> run ``rollout(shard, prompt)`` -> on success commit; on failure read it once
(:func:`diagnose`: class, type, whether it blames the shard, whether it is terminal, reason) and let the budgets
decide: retry (infra: after backoff, elsewhere; data: at once, elsewhere), data-failed (reported, written to the
ledger), or exhausted (skipped); whether a prompt given up on is reported, replaced from the run's reserve or ends
the run is :mod:`drops`' decision (NeMo-RL's ``max_skipped_prompts`` and companions). Workers
(``max_concurrency`` of them) pull prompts from a ready queue; prompts waiting out a backoff sit on a timer, not
on a worker.

Who does what: :class:`Dispatcher` owns the fleet view (slots, selection, ejection, the source) and runs attempts;
:class:`DispatchRun` owns a run's lifecycle (start, workers, watchdog, timers, outcomes, failing, closing);
``_Accounts`` is the one place an outcome is counted, into the run's :class:`RunStats`, the ``rollout_*`` metrics,
the observer and the ledger together. The run's ``stats.in_flight`` is the one in-flight count; the dispatcher's
``in_flight`` and the ``rollout_in_flight`` gauge are sums of it.

Health: the dispatcher follows its :class:`ShardSource`. When a shard leaves the healthy set, attempts in
flight on it are cancelled at once and redispatched, so a hung shard costs the probe detection time, not the
attempt timeout. Such an *eviction* is charged to neither budget: the fleet, not the prompt, ended the
attempt, and it cannot loop unboundedly because each one needs a healthy-set transition that the probes'
hysteresis rate-limits. Separately, an infra failure on a shard ejects it passively (see ``ejection``).

Ends: every prompt is handed out exactly once as :class:`Completed`, :class:`DataFailed` or :class:`Skipped`,
or is counted ``aborted`` in :class:`RunStats` when the run raises (RolloutRedispatchExhausted, RolloutStall
with ``stall_action="abort"``, a KeyboardInterrupt or SystemExit from a rollout) or is closed early. Anything else
a rollout raises, BaseExceptions and its own CancelledError included, ends that attempt in the taxonomy. Leaving the
``async for`` early closes the run: attempts in flight are cancelled and outcomes queued but not delivered count as
aborted. Every task the dispatcher starts is cancelled and awaited when its run or the dispatcher closes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from prometheus_client import CollectorRegistry

from rollout_runtime.dispatch import blame
from rollout_runtime.dispatch.affinity import affinity_key, pick_affine
from rollout_runtime.dispatch.budget import (
    DataFailedDecision,
    ExhaustedDecision,
    PromptBudget,
    RetryDecision,
    backoff_seconds,
    decide,
)
from rollout_runtime.dispatch.clock import Clock, LoopClock
from rollout_runtime.dispatch.deadlines import AttemptClock, ShardTimings
from rollout_runtime.dispatch.drops import DropCounts, DropKind, FailRun, ReplaceDecision, decide_drop
from rollout_runtime.dispatch.ejection import Ejection, EjectionTracker
from rollout_runtime.dispatch.ledger import FailureLedger, LedgerEntry, preview, stale_by_version
from rollout_runtime.dispatch.outcomes import (
    AttemptEnded,
    Completed,
    DataFailed,
    DispatchEvent,
    HealthyShardsChanged,
    Outcome,
    PromptId,
    RunStats,
    ShardEjected,
    ShardRestored,
    Skipped,
    StallDetected,
)
from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.dispatch.progress import bind_progress, unbind_progress
from rollout_runtime.dispatch.selection import ShardLoad, pick_shard
from rollout_runtime.dispatch.share import Shares
from rollout_runtime.dispatch.watchdog import StallVerdict, StallWatchdog, watch
from rollout_runtime.failures import (
    Diagnosis,
    FailureClass,
    NoHealthyShards,
    RolloutBatchTooSmall,
    RolloutDataFailure,
    RolloutFleetMisconfigured,
    RolloutRedispatchExhausted,
    RolloutStall,
    RolloutTimeout,
    diagnose,
)
from rollout_runtime.metrics import RolloutMetrics
from rollout_runtime.shards.model import HealthySet, ReportsCompletions, Shard, ShardSource, fleet_identity
from rollout_runtime.weights.gate import WeightsVerdict, WeightsView, lag_label, weights_verdict

if TYPE_CHECKING:
    from rollout_runtime.dispatch.session import DispatchSession

__all__ = ["DispatchRun", "Dispatcher", "Rollout"]

log = logging.getLogger("rollout_runtime.dispatch")

P = TypeVar("P")
R = TypeVar("R")
Rollout = Callable[[Shard, P], Awaitable[R]]
"""``rollout(shard, prompt)``: one attempt of one prompt on one shard; raise to fail it."""


@dataclass(slots=True, eq=False)
class _Attempt:
    task: asyncio.Task[Any]
    cancelling: int
    evicted: bool = False
    stalled: float | None = None
    """Set to the quiet time allowed when the progress watchdog abandoned the attempt."""
    trial: bool = False
    """Started while its shard was on trial: it counts against the trial's room (see ``ejection``)."""
    won_on: _Slot | None = None
    """The hedge's shard, when a hedged second attempt answered first."""
    won_started_version: int | None = None
    """The hedge's shard's weights version when the hedge started."""


@dataclass(slots=True, eq=False)
class _Slot(ShardLoad):
    attempts: set[_Attempt] = field(default_factory=set)
    turn_attempts: int = 0
    """Attempts started on it in this turn of the event loop (see ``Dispatcher._attempt``)."""
    trial_started: float = 0.0
    """Monotonic start of the first of its attempts in flight while on trial (see ``ejection``)."""
    trial_attempts: int = 0
    """Its attempts in flight that started on trial. The room counts these only: an attempt from before the ejection
    says nothing about the shard now, and one running for minutes must not keep the trial from starting."""

    @property
    def paced(self) -> bool:
        """It took its :data:`_TURN_BUDGET` new attempts this turn: the next waits a turn while another shard is
        pickable."""
        return self.turn_attempts >= _TURN_BUDGET


@dataclass(slots=True, eq=False)
class _PromptState:
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


class _ReadyQueue(asyncio.Queue["_PromptState | None"]):
    """Prompts waiting for a worker: one coming back for another attempt (a retry after its backoff, or an eviction)
    goes before every fresh prompt, in the order they came back; fresh prompts (and end markers) keep theirs.

    Otherwise a retry waits for the whole rest of the batch to be started: bench/failover.py measured a p99 prompt
    latency of 26 s from that alone. Uses asyncio.Queue's subclassing hooks (``_init``/``_put``/``_get``, as
    LifoQueue and PriorityQueue do), so waiting and waking stay asyncio's.
    """

    def _init(self, maxsize: int) -> None:
        self._queue: collections.deque[_PromptState | None] = collections.deque()
        self._again: collections.deque[_PromptState] = collections.deque()

    def _put(self, item: _PromptState | None) -> None:
        if item is not None and item.budget.attempts:
            self._again.append(item)
        else:
            self._queue.append(item)

    def _get(self) -> _PromptState | None:
        return self._again.popleft() if self._again else self._queue.popleft()

    def qsize(self) -> int:
        return len(self._queue) + len(self._again)

    def empty(self) -> bool:
        return not self._queue and not self._again


class _End:
    pass


def _reserve_ids(
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


_END = _End()


@dataclass(frozen=True, slots=True)
class _RunFailed:
    error: BaseException


AttemptOutcome = Literal["success", "infra_failure", "data_failure", "cancelled", "stale"]

_INITIAL_WORKERS = 64
"""Workers a run starts with; each attempt that reaches a shard starts one more, up to the concurrency limit. With no
shard to run on, a run of any size holds this many, not one per prompt."""

_TURN_BUDGET = 2
"""New attempts a shard takes per turn of the event loop while another shard is pickable (see
``Dispatcher._attempt``). With 1, most attempts of a saturated router waited a turn; with 4, the failover benchmark
wasted more attempts on shards that had just begun failing (docs/benchmarks.md)."""

_INTERRUPTS = (KeyboardInterrupt, SystemExit)
"""Not an attempt's failure: the run ends with them (every prompt accounted for) and the consumer sees them."""


class _Accounts:
    """The one accounting path of a run: each outcome goes to its stats, the metrics, the observer and the ledger here.

    No outcome path updates those by hand, so they cannot disagree. ``stats.in_flight`` is the only count of
    attempts in flight: the dispatcher's and the ``rollout_in_flight`` gauge are sums of it.
    """

    __slots__ = ("_clock", "_emit", "_ledger", "_metrics", "stats", "watchdog")

    def __init__(
        self,
        stats: RunStats,
        metrics: RolloutMetrics,
        clock: Clock,
        emit: Callable[[DispatchEvent], None] | None,
        ledger: FailureLedger | None,
    ) -> None:
        self.stats = stats
        self.watchdog: StallWatchdog | None = None
        self._metrics = metrics
        self._clock = clock
        self._emit = emit
        self._ledger = ledger

    def run_started(self) -> None:
        if self._metrics.last_commit_timestamp is None:
            # Progress is measured from the first run's start, so a run that never commits still shows as a stall.
            self._metrics.last_commit_timestamp = self._clock.wall()

    def attempt_started(self) -> None:
        self.stats.in_flight += 1

    def attempt_stopped(self) -> None:
        """The attempt no longer runs; how it ended is recorded apart, and only while the run still wants it."""
        self.stats.in_flight -= 1

    def attempt_ended(
        self,
        outcome: AttemptOutcome,
        prompt_id: PromptId,
        shard: str | None,
        seconds: float | None,
        diagnosis: Diagnosis | None = None,
    ) -> None:
        """An attempt ended; ``seconds`` is None when it never reached a shard (no duration to observe)."""
        self._count_attempt(outcome, seconds)
        if diagnosis is not None:
            self._metrics.failure(diagnosis.failure_class.value, diagnosis.failure_type)
        if self._emit is not None:
            kind = diagnosis.failure_type if diagnosis is not None else None
            self._emit(AttemptEnded(prompt_id, shard, outcome, kind, seconds or 0.0))

    def attempt_abandoned(self) -> None:
        """An attempt cut off by its own run's end: counted as cancelled, with no duration and no event."""
        self._count_attempt("cancelled", None)

    def _count_attempt(self, outcome: AttemptOutcome, seconds: float | None) -> None:
        stats = self.stats
        if outcome == "success":
            stats.successes += 1
        elif outcome == "infra_failure":
            stats.infra_failures += 1
        elif outcome == "data_failure":
            stats.data_failures += 1
        elif outcome == "stale":
            stats.stale += 1
        else:
            stats.cancelled += 1
        self._metrics.attempt(outcome, seconds)

    def prompt_ended(self, outcome: Outcome[Any, Any], stale_versions: Mapping[int | None, int] | None = None) -> None:
        """A prompt has its outcome; one that completed or data-failed is progress (for the stall watchdog and
        ``rollout_last_commit_timestamp_seconds``)."""
        stats, metrics = self.stats, self._metrics
        if isinstance(outcome, Completed):
            stats.completed += 1
            metrics.prompts["completed"] += 1
        elif isinstance(outcome, DataFailed):
            self._report(outcome, stale_versions)
            stats.data_failed += 1
            metrics.prompts["data_failed"] += 1
        else:
            self._report(outcome, stale_versions)
            stats.skipped += 1
            metrics.prompts["skipped"] += 1
            return
        metrics.last_commit_timestamp = self._clock.wall()
        if self.watchdog is not None:
            self.watchdog.committed(self._clock.monotonic())

    def _report(
        self, outcome: DataFailed[Any] | Skipped[Any], stale_versions: Mapping[int | None, int] | None = None
    ) -> None:
        """Log and ledger a prompt that ended without a result, before it is counted: a ledger that cannot be
        written ends the run with this prompt aborted, not both aborted and counted."""
        result: Literal["data_failed", "skipped"]
        if isinstance(outcome, DataFailed):
            result, verb, cls = "data_failed", "data-failed", outcome.failure_class
        else:
            result, verb, cls = "skipped", "skipped", FailureClass.INFRA
        log.warning("prompt %s %s after %d attempt(s): %s", outcome.prompt_id, verb, outcome.attempts, outcome.reason)
        if self._ledger is None:
            return
        self._ledger.write(
            LedgerEntry(
                prompt_id=outcome.prompt_id,
                result=result,
                failure_class=cls.value,
                failure_type=outcome.failure_type,
                reason=outcome.reason,
                attempts=outcome.attempts,
                shards=outcome.shards,
                time=self._clock.wall(),
                prompt_preview=preview(outcome.prompt),
                stale_by_version=stale_by_version(stale_versions or {}),
            )
        )

    def committed(self, verdict: WeightsVerdict) -> None:
        """A result is about to be committed: count it by weights version and lag."""
        by_version = self.stats.committed_by_version
        by_version[verdict.version] = by_version.get(verdict.version, 0) + 1
        self._metrics.committed(lag_label(verdict.lag))

    def redispatched(self) -> None:
        self.stats.redispatches += 1
        self._metrics.redispatches += 1

    def exhausted(self) -> None:
        """A prompt used up its infra budget (it is then skipped, or the run ends)."""
        self.stats.exhausted += 1
        self._metrics.exhausted += 1

    def ejected(self, shard: str, ejection: Ejection) -> None:
        self.stats.ejections += 1
        self._metrics.ejection(shard)
        if self._emit is not None:
            self._emit(ShardEjected(shard, ejection.seconds, ejection.count))

    def stalled(self, verdict: StallVerdict) -> None:
        self.stats.stalls += 1
        self._metrics.stalls[verdict.action] += 1
        if self._emit is not None:
            self._emit(StallDetected(verdict.action, verdict.idle_seconds, verdict.unfinished))


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
        dispatcher: Dispatcher,
        states: list[_PromptState],
        rollout: Rollout[P, R],
        reserve: Iterable[tuple[PromptId, P]] = (),
    ) -> None:
        self._dispatcher = dispatcher
        self.states = states
        self.rollout = rollout
        self.stats = RunStats(submitted=len(states))
        self.size = len(states)
        """The batch size: the prompts the run was given (replacements refill positions, they add none)."""
        self.reserve: collections.deque[tuple[PromptId, P]] = collections.deque(reserve)
        self.lost = 0
        """Batch positions given up on and not refilled."""
        self.replaced: collections.Counter[int] = collections.Counter()
        """Replacements drawn per batch position."""
        self.drop_rules = True
        """Whether NeMo-RL's drop allowances apply (a training step); see :meth:`Dispatcher.run`."""
        observer = dispatcher._emit if dispatcher._observer is not None else None
        self.accounts = _Accounts(self.stats, dispatcher.metrics, dispatcher.clock, observer, dispatcher._ledger)
        self.ready: asyncio.Queue[_PromptState | None] = _ReadyQueue()
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
        policy = self._dispatcher.policy
        self.worker_limit = len(self.states)
        if policy.max_concurrency is not None:
            self.worker_limit = min(self.worker_limit, policy.max_concurrency)
        for _ in range(min(self.worker_limit, _INITIAL_WORKERS)):
            self._spawn_worker()
        self._start_watchdog()

    def _start_watchdog(self) -> None:
        """Watch the run for stalls (nothing committed for ``stall_deadline_seconds``), from now on."""
        policy, clock = self._dispatcher.policy, self._dispatcher._now
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
        self.workers.append(asyncio.create_task(self._dispatcher._worker(self), name=name))

    def grow(self) -> None:
        """An attempt reached a shard: start one more worker while prompts wait and the concurrency limit allows."""
        if self.active and len(self.workers) < self.worker_limit and not self.ready.empty():
            self._spawn_worker()

    def finish(self, state: _PromptState, outcome: Outcome[P, R]) -> None:
        """Hand out the prompt's one outcome (counted first); after the last one, end the run."""
        self.accounts.prompt_ended(outcome, state.stale_versions)
        state.done = True
        self.outcomes.put_nowait(outcome)
        if self.stats.unfinished == 0:
            self.outcomes.put_nowait(_END)
            for _ in self.workers:
                self.ready.put_nowait(None)

    def replace(self, state: _PromptState) -> None:
        """Submit the next reserve prompt in ``state``'s batch position (before ``state``'s outcome, so the run
        cannot end in between)."""
        prompt_id, prompt = self.reserve.popleft()
        self.replaced[state.position] += 1
        fresh = _PromptState(prompt_id=prompt_id, prompt=prompt, position=state.position)
        self.states.append(fresh)
        self.stats.submitted += 1
        log.info("prompt %s replaces prompt %s in batch position %d", prompt_id, state.prompt_id, state.position)
        self.ready.put_nowait(fresh)

    def requeue(self, state: _PromptState, delay: float) -> None:
        """Send the prompt back for another attempt, after ``delay`` seconds on a loop timer (not on a worker).

        A prompt whose ``retry_refused`` attribute is set (a reason) is not tried again: it is given up on as
        skipped with that reason. The router's streamed requests say so once their first byte reached the client.
        """
        refused = getattr(state.prompt, "retry_refused", None)
        if refused is not None:
            self._dispatcher._refused(self, state, str(refused))
            return
        self.accounts.redispatched()
        if delay <= 0:
            self.ready.put_nowait(state)
            return

        def ready_again() -> None:
            self.timers.discard(handle)
            if self.active:
                self.ready.put_nowait(state)

        handle = self._dispatcher._loop.call_later(delay, ready_again)
        self.timers.add(handle)

    def fail_prompt(self, state: _PromptState, error: BaseException) -> None:
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
        evidence = self._dispatcher._evidence
        for state in self.states:
            if not state.done:  # a later run may reuse the ids: its prompts start with no evidence
                evidence.forget(state.prompt_id)
        self._dispatcher._runs.discard(self)
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


class Dispatcher:
    """Runs prompts across the healthy shards of a :class:`ShardSource` under a :class:`DispatchPolicy`.

    ::

        async with Dispatcher(source, policy) as dispatcher:
            async for outcome in dispatcher.run(prompts, rollout):
                ...

    ``metrics`` (or a ``registry`` to create them on; default a private one) receives the ``rollout_*``
    metrics, labelled with the source's ``fleet`` and ``namespace`` (:func:`~rollout_runtime.shards.fleet_identity`)
    unless the caller passes its own; ``observer`` is called synchronously with every :data:`DispatchEvent` (keep
    it cheap); ``seed`` makes backoff jitter reproducible; ``clock`` replaces the loop clock in tests.
    """

    def __init__(
        self,
        source: ShardSource,
        policy: DispatchPolicy | None = None,
        *,
        metrics: RolloutMetrics | None = None,
        registry: CollectorRegistry | None = None,
        observer: Callable[[DispatchEvent], None] | None = None,
        clock: Clock | None = None,
        seed: int | None = None,
        ledger: FailureLedger | None = None,
        weights: WeightsView | None = None,
    ) -> None:
        self.policy = policy if policy is not None else DispatchPolicy()
        if metrics is None:
            fleet, namespace = fleet_identity(source)
            metrics = RolloutMetrics(registry, fleet=fleet, namespace=namespace)
        self.metrics = metrics
        self._source = source
        self._completions = source if isinstance(source, ReportsCompletions) else None  # passive liveness
        self._weights = weights if weights is not None else _weights_of(source)  # stale gating (see weights/)
        if self._weights is not None:
            self.metrics.stale_shards = self._weights.stale_shards
        self._observer = observer
        self._clock: Clock | None = clock
        self._rng = random.Random(seed)
        self._ledger = ledger
        if ledger is None and self.policy.failure_ledger_path is not None:
            self._ledger = FailureLedger(self.policy.failure_ledger_path)
        self._ejections = EjectionTracker(
            self.policy.ejection_base_seconds,
            self.policy.ejection_max_seconds,
            self.policy.max_ejection_percent,
            probe_grace=self._backoff,
        )
        self._evidence = blame.Evidence()
        self._shares = Shares()
        self.drops = DropCounts()
        """Prompts given up on over every run (``max_skipped_prompts``, ``max_consecutive_dropped_prompts``)."""
        self._slots: dict[str, _Slot] = {}
        self._timings: dict[str, ShardTimings] = {}
        self._routable: list[_Slot] = []
        self._pickable: list[_Slot] = []
        """The routable shards an attempt may start on now: not held, and not on trial with its one attempt out."""
        self._panic = False
        self._fresh: list[_Slot] = []
        """Shards with attempts started in this turn of the event loop."""
        self._turn_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        """Attempts paced to a later turn (see ``_attempt``)."""
        self._aging = False
        """An ``_age`` is scheduled for the next turn."""
        self._cursor = 0
        self._snapshot: HealthySet | None = None
        self._changed = asyncio.Event()
        self._runs: set[DispatchRun[Any, Any]] = set()
        self._follower: asyncio.Task[None] | None = None
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._entered = False
        self._loop: asyncio.AbstractEventLoop
        self._stop_counting: Callable[[], None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def __aenter__(self) -> Dispatcher:
        if self._entered:
            raise RuntimeError("a Dispatcher can be entered once")
        self._entered = True
        self._loop = asyncio.get_running_loop()
        if self._clock is None:
            self._clock = LoopClock(self._loop)
        self._follower = asyncio.create_task(self._follow(), name="rollout-dispatch-follow-shards")
        self._stop_counting = self.metrics.count_in_flight(lambda: self.in_flight)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every run, the shard-source follower and timers; close the ledger."""
        for run in list(self._runs):
            await run.aclose()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        if self._ledger is not None:
            self._ledger.close()
        if self._stop_counting is not None:
            self._stop_counting()
            self._stop_counting = None

    # -- public view ----------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> HealthySet | None:
        """The healthy set in force (None until the source yields one)."""
        return self._snapshot

    @property
    def routable(self) -> tuple[str, ...]:
        """Shards in rotation: healthy minus ejected (all healthy in panic mode). A held shard, or one on trial with its
        one attempt out, is among them but takes no new attempt until that ends (see ``ejection``)."""
        return tuple(slot.name for slot in self._routable)

    @property
    def ejected(self) -> frozenset[str]:
        return self._ejections.ejected

    @property
    def in_flight(self) -> int:
        """Attempts running now, over every run (each run's ``stats.in_flight`` is the count; this is its sum)."""
        return sum(run.stats.in_flight for run in tuple(self._runs))

    def outstanding(self) -> dict[str, int]:
        """Attempts in flight per healthy shard."""
        return {name: slot.outstanding for name, slot in self._slots.items()}

    def weights_version(self, shard: str) -> int | None:
        """The weights version ``shard`` is known to serve (None: weights not tracked, or unknown)."""
        return self._weights.version_of(shard) if self._weights is not None else None

    def run(
        self,
        prompts: Iterable[P],
        rollout: Rollout[P, R],
        *,
        prompt_ids: Sequence[PromptId] | None = None,
        reserve: Iterable[P] = (),
        reserve_ids: Sequence[PromptId] | None = None,
        drop_rules: bool = True,
    ) -> DispatchRun[P, R]:
        """Start dispatching ``prompts`` (ids: their positions, or ``prompt_ids``) when first iterated.

        ``drop_rules=False``: the prompts are independent requests, not a training step (the router's requests, an
        environment pool's episodes): a prompt given up on is only reported, and NeMo-RL's drop allowances
        (``max_skipped_prompts``, ``max_consecutive_dropped_prompts``, ``min_step_batch_fraction``) neither count
        it nor end the run for it.

        ``reserve``: spare prompts for ``on_dropped_prompt="replace"`` (at least ``replacement_reserve_prompts``):
        a prompt given up on is reported as usual and the next reserve prompt takes its batch position, so the run
        still yields up to ``len(prompts)`` completions. A reserve prompt is submitted (and accounted for) only when
        drawn; their ids continue the positions (``len(prompts)``, ...) or are ``reserve_ids``.
        """
        if not self._entered or self._follower is None:
            raise RuntimeError("use the Dispatcher as `async with Dispatcher(...) as dispatcher:` before run()")
        items, spares = list(prompts), list(reserve)
        ids: Sequence[PromptId] = range(len(items)) if prompt_ids is None else prompt_ids
        if len(ids) != len(items):
            raise ValueError(f"got {len(ids)} prompt_ids for {len(items)} prompts")
        spare_ids = _reserve_ids(self.policy, len(items), spares, prompt_ids, reserve_ids)
        if len(set(ids) | set(spare_ids)) != len(ids) + len(spare_ids):
            raise ValueError("prompt_ids and reserve_ids must be unique: each prompt is accounted for exactly once")
        states = [
            _PromptState(prompt_id=i, prompt=p, position=n) for n, (i, p) in enumerate(zip(ids, items, strict=True))
        ]
        run: DispatchRun[P, R] = DispatchRun(self, states, rollout, zip(spare_ids, spares, strict=True))
        run.drop_rules = drop_rules
        self._runs.add(run)
        return run

    def session(
        self,
        rollout: Rollout[P, R],
        *,
        drop_rules: bool = True,
        on_prompt_error: Literal["end_session", "fail_prompt"] = "end_session",
    ) -> DispatchSession[P, R]:
        """A long-lived online session: ``submit(prompt)`` one at a time, sharing budgets, the stall watchdog,
        ejection state and stats (see :mod:`rollout_runtime.dispatch.session`). Close it (``async with``) when done.
        ``drop_rules=False``: the submissions are independent requests (an OpenAI-shaped client's calls, a verl
        server's requests): a prompt given up on is that call's answer, never the end of the session (see
        :meth:`run`). ``on_prompt_error="fail_prompt"``: a run-terminal error found on one submission's attempt (no
        routable shard for a whole healthy wait, a misconfigured-fleet verdict) is raised by that submission's
        future alone and the session goes on (a router answers each request on its own)."""
        from rollout_runtime.dispatch.session import DispatchSession

        if not self._entered or self._follower is None:
            raise RuntimeError("use the Dispatcher as `async with Dispatcher(...) as dispatcher:` before session()")
        session: DispatchSession[P, R] = DispatchSession(self, rollout, on_prompt_error=on_prompt_error)
        session.drop_rules = drop_rules
        self._runs.add(session)
        return session

    async def wait_ready(self, min_shards: int = 1, timeout: float | None = None) -> tuple[str, ...]:  # noqa: ASYNC109
        """Wait until at least ``min_shards`` shards are routable; return their names.

        Raises :class:`NoHealthyShards` after ``timeout`` seconds (None: wait forever), naming the shards the
        source knows and why they are not ready when the source can say (:meth:`not_ready_reasons`).
        """
        if min_shards < 1:
            raise ValueError(f"min_shards must be >= 1, got {min_shards}")
        try:
            async with asyncio.timeout(timeout):
                while len(self._routable) < min_shards:
                    await self._changed.wait()
        except TimeoutError:
            raise NoHealthyShards(self._not_ready_message(min_shards, timeout)) from None
        return self.routable

    def not_ready_reasons(self) -> dict[str, str]:
        """Shard name -> why it is not in the healthy set, from a source that knows (``not_ready_reasons()``)."""
        reasons = getattr(self._source, "not_ready_reasons", None)
        if reasons is None:
            return {}
        try:
            return dict(reasons())
        except Exception:
            log.exception("shard source failed to say why shards are not ready")
            return {}

    def _not_ready_message(self, min_shards: int, timeout: float | None) -> str:
        routable = len(self._routable)
        waited = "" if timeout is None else f", after {timeout:g}s"
        message = f"{routable} routable shard(s), {min_shards} needed{waited}"
        reasons = self.not_ready_reasons()
        if reasons:
            message += "; not ready: " + "; ".join(f"{name}: {why}" for name, why in sorted(reasons.items())[:10])
        return message

    # -- the attempt loop -----------------------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        assert self._clock is not None, "the dispatcher has not been entered"
        return self._clock

    def _now(self) -> float:
        return self.clock.monotonic()

    async def _worker(self, run: DispatchRun[Any, Any]) -> None:
        ready = run.ready
        try:
            while run.active:
                state = await ready.get()
                if state is None or not run.active:
                    return
                await self._attempt(run, state)
        except asyncio.CancelledError:
            raise
        except (RolloutRedispatchExhausted, RolloutStall) as exc:  # raised by the rollout itself: run-terminal
            run.fail(exc)
        except _INTERRUPTS as exc:  # Ctrl-C or sys.exit() inside a rollout: every prompt is accounted, then it ends
            run.fail(exc)
        except BaseException as exc:  # a bug in an observer, the ledger's disk...: the run ends loudly
            log.exception("dispatcher worker failed")
            run.fail(exc)

    def _pick(self, state: _PromptState, *, fallback: bool = False) -> _Slot | None:
        """The shard for ``state``'s next attempt; None if none can take one now. In panic mode every shard is on
        trial, and a retry waits for room on another one instead of going back to the shard that just failed it
        (which answers fastest, so has room first); ``fallback`` lifts that once the healthy wait is over."""
        routable = self._pickable
        failed = state.last_failed
        if self._panic and not fallback and failed is not None and len(self._routable) > 1:
            routable = [slot for slot in routable if slot.name != failed]
        if not routable:
            return None
        self._cursor += 1
        if (key := affinity_key(state.prompt)) is not None:  # a session stays on its shard while it is routable
            return pick_affine(routable, key, last_failed=state.last_failed, tried=state.tried)
        return pick_shard(routable, start=self._cursor, last_failed=state.last_failed, tried=state.tried)

    async def _wait_for_shard(self, state: _PromptState) -> _Slot | None:
        # One absolute deadline on the loop's clock. Recomputing "deadline - now" each turn can leave a remainder
        # below the clock's resolution (1e-15 s) that is due at once forever: a spin that never lets time move.
        try:
            async with asyncio.timeout(self.policy.healthy_wait_seconds):
                while (slot := self._pick(state)) is None:
                    await self._changed.wait()
        except TimeoutError:
            return self._pick(state, fallback=True)
        return slot

    async def _attempt(self, run: DispatchRun[Any, Any], state: _PromptState) -> None:
        slot = self._pick(state)
        # Pacing: while another shard is pickable, a shard takes at most _TURN_BUDGET new attempts per turn of the
        # event loop. Attempts sent together come back together, and least-outstanding replaces each on the shard it
        # left; when that shard has just begun answering 503, the whole batch would be sent to it before the loop
        # reads the first answer. Waiting a turn lets the loop read the network in between.
        if slot is not None and (slot.paced or self._turn_waiters) and len(self._pickable) > 1:
            behind = True  # a newcomer queues behind the attempts already waiting for a turn: first come, first served
            while True:
                await self._next_turn(behind)
                if not run.active:
                    return
                slot = self._pick(state)
                if slot is None or not slot.paced or len(self._pickable) <= 1:
                    break
                behind = False  # woken in its turn and paced again: first in line for the next one
        if slot is None:
            slot = await self._wait_for_shard(state)
            if not run.active:
                return
            if slot is None:
                self._no_shard(run, state)
                return
        run.grow()
        task = asyncio.current_task()
        assert task is not None
        record = _Attempt(task, task.cancelling())
        accounts = run.accounts
        self._occupy(slot, record)
        accounts.attempt_started()
        if slot.name not in state.tried:
            state.tried.append(slot.name)
        timeout = self.policy.attempt_timeout_seconds
        clock = self.clock.monotonic
        started = clock()
        started_version = self._weights.version_of(slot.name) if self._weights is not None else None
        failure: BaseException | None = None
        evicted = False
        result: Any = None
        deadline: asyncio.Timeout | None = None
        watch = self._attempt_clock(slot.name, started)
        try:
            try:
                if timeout is None:
                    result = await self._hedged(run, slot, state, record, watch)
                else:
                    async with asyncio.timeout(timeout) as deadline:
                        result = await self._hedged(run, slot, state, record, watch)
            except asyncio.CancelledError as exc:
                if task.cancelling() <= record.cancelling:
                    failure = exc  # raised by the rollout itself (an inner task's cancellation), not by us: a failure
                elif record.evicted and task.uncancel() <= record.cancelling:
                    evicted = True
                else:
                    accounts.attempt_abandoned()
                    raise
            except (RolloutRedispatchExhausted, RolloutStall):
                raise
            except _INTERRUPTS:
                accounts.attempt_abandoned()
                raise
            except TimeoutError as exc:
                failure = exc
                if deadline is not None and deadline.expired():
                    failure = RolloutTimeout(f"attempt exceeded {timeout:g}s on shard {slot.name}")
                    failure.__cause__ = exc
                elif record.stalled is not None:
                    quiet = "no token" if watch is not None and watch.tokens else "no answer or first token"
                    failure = RolloutTimeout(
                        f"{quiet} for {record.stalled:.3g}s on shard {slot.name} (its recent timings allow that much)"
                    )
                    failure.__cause__ = exc
            except BaseException as exc:  # GeneratorExit, a library's own BaseException: this attempt failed
                failure = exc
            else:
                if record.evicted:
                    task.uncancel()  # the rollout swallowed the cancellation; its result still stands
        finally:
            self._release(slot, record)
            accounts.attempt_stopped()
        seconds = clock() - started
        if not run.active:
            return
        if evicted:
            accounts.attempt_ended("cancelled", state.prompt_id, slot.name, seconds)
            state.budget.evictions += 1
            state.last_failed = slot.name
            run.requeue(state, 0.0)
        elif failure is not None:
            self._failed(run, state, slot, failure, seconds, immediate=record.stalled is not None)
        elif not (verdict := self._verdict(record, slot, started_version)).committable:
            self._stale(run, state, (record.won_on or slot).name, seconds, verdict)
        else:
            if watch is not None and record.won_on is None:
                watch.succeeded(clock())
            winner = record.won_on if record.won_on is not None else slot
            shard = winner.name
            accounts.attempt_ended("success", state.prompt_id, shard, seconds)
            self._evidence.succeeded(shard, state.prompt_id)
            if self._panic and self._ejections.restore_served(shard, started=started, now=clock()):
                self._emit(ShardRestored(shard, "served"))  # back in rotation, which ends panic mode
                self._recompute()
            was_on_trial = self._ejections.on_trial(shard)
            self._ejections.served(shard, started=started)
            if was_on_trial and not self._ejections.on_trial(shard):
                self._refresh_pickable()  # its room no longer applies
            winner.weight = winner.shard.weight * self._shares.served(shard)
            if self._completions is not None:
                self._completions.attempt_succeeded(shard)
            attempts = state.budget.attempts + 1
            accounts.committed(verdict)
            self.drops.committed()
            completed = Completed(state.prompt_id, state.prompt, result, attempts, shard, verdict.version)
            run.finish(state, completed)

    def _attempt_clock(self, shard: str, started: float) -> AttemptClock | None:
        """The attempt's progress deadlines from its shard's recent timings; None without the watchdog or hedging."""
        policy = self.policy
        if not policy.progress_watchdog and policy.hedge_factor is None:
            return None
        timings = self._timings.get(shard)
        if timings is None:
            timings = self._timings[shard] = ShardTimings()
        return AttemptClock(
            timings,
            started,
            factor=policy.progress_factor,
            floor=policy.progress_floor_seconds,
            cap=policy.progress_cap_seconds,
        )

    async def _call(
        self, run: DispatchRun[Any, Any], slot: _Slot, state: _PromptState, record: _Attempt, watch: AttemptClock | None
    ) -> Any:
        """``rollout(shard, prompt)``, watched for progress when the policy asks: the rollout reports tokens through
        :func:`~rollout_runtime.dispatch.progress.report_progress`; a quiet spell past the deadline ends the call
        with TimeoutError and sets ``record.stalled``. The first token moves the check to the gap rule's due time, so
        a stream that stalls after a few tokens is judged by the shard's inter-token gaps, not its first-token
        allowance (the cap while the shard has few first-token timings)."""
        if watch is None or not self.policy.progress_watchdog:
            return await run.rollout(slot.shard, state.prompt)
        loop, now = self._loop, self.clock.monotonic
        quiet = asyncio.timeout(None)
        handle: asyncio.TimerHandle | None = None
        checks_at = math.inf

        def schedule(moment: float) -> None:
            nonlocal handle, checks_at
            if handle is not None:
                handle.cancel()
            checks_at = watch.due()
            handle = loop.call_later(checks_at - moment, check)

        def check() -> None:
            moment = now()
            if watch.stalled(moment):
                record.stalled = watch.allowed
                quiet.reschedule(loop.time())
            else:
                schedule(moment)

        def progressed(tokens: int) -> None:
            moment = now()
            watch.progress(moment, tokens)
            if watch.due() < checks_at:  # the first token: from now on the gap rule, often far tighter, applies
                schedule(moment)

        token = bind_progress(progressed)
        try:
            async with quiet:
                schedule(now())
                return await run.rollout(slot.shard, state.prompt)
        finally:
            unbind_progress(token)
            if handle is not None:
                handle.cancel()

    async def _hedged(
        self, run: DispatchRun[Any, Any], slot: _Slot, state: _PromptState, record: _Attempt, watch: AttemptClock | None
    ) -> Any:
        """:meth:`_call`, plus opt-in hedging: still running after the shard's p99 latency x ``hedge_factor``, a
        second attempt starts on another shard; the first answer wins and the other is cancelled (wasted)."""
        factor = self.policy.hedge_factor
        timings = self._timings.get(slot.name)
        p99 = timings.latency.quantile(0.99) if factor is not None and timings is not None else None
        if p99 is None or factor is None:
            return await self._call(run, slot, state, record, watch)
        primary = asyncio.ensure_future(self._call(run, slot, state, record, watch))
        try:
            done, _ = await asyncio.wait({primary}, timeout=p99 * factor)
            if done:
                return primary.result()
            self._cursor += 1
            other = pick_shard(self._pickable, start=self._cursor, last_failed=slot.name, tried=state.tried)
            if other is None or other is slot:
                return await primary
            return await self._race(run, state, primary, slot, other, record)
        finally:
            if not primary.done():
                primary.cancel()
                with contextlib.suppress(BaseException):
                    await primary

    async def _race(
        self,
        run: DispatchRun[Any, Any],
        state: _PromptState,
        primary: asyncio.Future[Any],
        slot: _Slot,
        other: _Slot,
        record: _Attempt,
    ) -> Any:
        """Run the hedge on ``other`` against ``primary``: the first success wins; if one fails, wait for the other;
        if both fail, the primary's failure is the attempt's. The extra attempt is accounted as a cancelled one, on the
        loser's shard (the winner's is the attempt's own outcome)."""
        accounts, clock = run.accounts, self.clock.monotonic
        hedge = asyncio.ensure_future(run.rollout(other.shard, state.prompt))
        hedge_record = _Attempt(hedge, 0)
        hedge_version = self._weights.version_of(other.name) if self._weights is not None else None
        self._occupy(other, hedge_record)  # an eviction of the hedge's shard cancels the hedge only
        accounts.attempt_started()
        run.stats.hedges += 1
        if other.name not in state.tried:
            state.tried.append(other.name)
        started = clock()
        try:
            pending: set[asyncio.Future[Any]] = {primary, hedge}
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                winner = next((t for t in done if not t.cancelled() and t.exception() is None), None)
                if winner is not None:
                    if pending:
                        run.stats.hedges_wasted += 1
                    if winner is hedge:
                        record.won_on, record.won_started_version = other, hedge_version
                    return winner.result()
            return primary.result()  # both failed: raise the primary's failure
        finally:
            if not hedge.done():
                hedge.cancel()
                with contextlib.suppress(BaseException):
                    await hedge
            self._release(other, hedge_record)
            accounts.attempt_stopped()
            loser = slot.name if record.won_on is other else other.name
            accounts.attempt_ended("cancelled", state.prompt_id, loser, clock() - started)

    def _verdict(self, record: _Attempt, slot: _Slot, started_version: int | None) -> WeightsVerdict:
        weights = self._weights
        if weights is None:
            return WeightsVerdict(True, None, None)
        if record.won_on is not None:  # the hedge answered: its own shard's versions decide
            slot, started_version = record.won_on, record.won_started_version
        answered = weights.version_of(slot.name)
        return weights_verdict(weights.policy_version, started_version, answered, self.policy.max_weights_lag)

    def _stale(
        self, run: DispatchRun[Any, Any], state: _PromptState, name: str, seconds: float, verdict: WeightsVerdict
    ) -> None:
        """An answer from outside the allowed weights: not committed, redispatched elsewhere, no budget charged."""
        log.info("prompt %s: answer from shard %s not committed: %s", state.prompt_id, name, verdict.reason)
        state.stale_versions[verdict.version] = state.stale_versions.get(verdict.version, 0) + 1
        run.accounts.attempt_ended("stale", state.prompt_id, name, seconds)
        state.budget.evictions += 1
        state.last_failed = name
        run.requeue(state, 0.0)

    def _failed(
        self,
        run: DispatchRun[Any, Any],
        state: _PromptState,
        slot: _Slot | None,
        exc: BaseException,
        seconds: float | None,
        *,
        immediate: bool = False,
    ) -> None:
        """``immediate``: a retry goes back at once, without backoff (the watchdog already waited)."""
        diagnosis = diagnose(exc)
        sig = blame.signature(diagnosis, slot.name, slot.shard.endpoint) if slot is not None else None
        verdict = blame.Verdict(blame.Blame.FIRST_VERDICT)
        if slot is not None and sig is not None:
            verdict = blame.judge(
                self._evidence,
                prompt=state.prompt_id,
                shard=slot.name,
                sig=sig,
                diagnosis=diagnosis,
                healthy=self._slots,
                in_flight=sum(other.outstanding for other in self._slots.values()),
            )
        kind = verdict.blame
        failure_class = FailureClass.DATA if kind is blame.Blame.POISON else diagnosis.failure_class
        if kind is blame.Blame.SICK_SHARD:
            failure_class = FailureClass.INFRA
        outcome: AttemptOutcome
        if kind is blame.Blame.BACKPRESSURE:
            outcome = "infra_failure"
            state.budget.evictions += 1  # busy, not broken: charged to neither budget
        elif failure_class is FailureClass.INFRA:
            outcome = "infra_failure"
            state.budget.infra_failures += 1
        else:
            outcome = "data_failure"
            state.budget.data_failures += 1
            if slot is not None and sig is not None and kind is blame.Blame.FIRST_VERDICT:
                state.data_charges.append((slot.name, sig))
        if slot is not None:
            state.last_failed = slot.name
        run.accounts.attempt_ended(outcome, state.prompt_id, slot.name if slot else None, seconds, diagnosis)
        if kind is blame.Blame.MISCONFIGURED:
            error = RolloutFleetMisconfigured(verdict.evidence)
            error.__cause__ = exc
            log.error("%s", error)
            run.fail_prompt(state, error)
            return
        if kind is blame.Blame.POISON:
            self._data_failed(run, state, diagnosis, f"{verdict.evidence}; {diagnosis.reason}", exc=exc)
            return
        if slot is not None and kind is blame.Blame.BACKPRESSURE:
            slot.weight = slot.shard.weight * self._shares.busy(slot.name)
            run.requeue(state, self._backpressure_delay(slot, diagnosis))
            return
        answered = blame.waits_for_evidence(sig)
        moves_on = False
        if slot is not None and ((diagnosis.blames_shard and not answered) or kind is blame.Blame.SICK_SHARD):
            self._eject(run, slot.name, seconds)  # an answer a poison prompt could explain: on evidence, not at once
            moves_on = self._elsewhere(slot)
        draw = self._rng.random()
        if failure_class is FailureClass.DATA and state.data_charges:
            self._refund(state)
        decision = decide(self.policy, state.budget, failure_class, terminal=diagnosis.terminal, draw=draw)
        disagree = len({charge for _, charge in state.data_charges}) > 1
        unconfirmed = sig is not None and (disagree or not self._evidence.confirmed(state.prompt_id, sig))
        if isinstance(decision, DataFailedDecision) and not decision.terminal and unconfirmed:
            # Shards answered this prompt differently: that says the shards differ, not that the prompt is bad.
            state.budget.data_failures -= 1
            state.budget.infra_failures += 1
            state.data_charges = state.data_charges[:-1]
            failure_class = FailureClass.INFRA
            decision = decide(self.policy, state.budget, failure_class, draw=draw)
        if isinstance(decision, DataFailedDecision):
            self._data_failed(run, state, diagnosis, exc=exc)
        elif isinstance(decision, ExhaustedDecision) and self._evidence.followed(state.prompt_id, sig):
            # Every shard it went to gave the same non-transient answer and the fleet is not misconfigured: the prompt
            # is the common factor, even before those shards had served others.
            shards = ", ".join(sorted(set(state.tried)))
            self._data_failed(
                run, state, diagnosis, f"poison prompt: the same answer on shards {shards}; {diagnosis.reason}", exc=exc
            )
        elif isinstance(decision, ExhaustedDecision):
            self._exhausted(run, state, exc, diagnosis)
        elif isinstance(decision, RetryDecision) and (answered or moves_on):
            # The shard answered (the fleet is up), or the failure was the shard's and another shard is there to take
            # the retry: it goes at once. The backoff protects a sick fleet from a storm; each such failure takes its
            # shard out of rotation, so the immediate retries stop when no other shard is left. A failure that is not
            # the shard's (an environment server down) still backs off: another shard would not help.
            run.requeue(state, 0.0)
        else:
            run.requeue(state, 0.0 if immediate else decision.delay_seconds)

    def _elsewhere(self, slot: _Slot | None) -> bool:
        """Whether an attempt could start now on a shard other than ``slot``."""
        return any(other is not slot for other in self._pickable)

    def _refund(self, state: _PromptState) -> None:
        """Data charges made by shards since judged sick for that same failure do not count against the prompt."""
        sick = [charge for charge in state.data_charges if self._evidence.judged_sick(*charge)]
        if sick:
            state.data_charges = [charge for charge in state.data_charges if charge not in sick]
            state.budget.data_failures -= len(sick)
            state.budget.infra_failures += len(sick)

    def _backpressure_delay(self, slot: _Slot, diagnosis: Diagnosis) -> float:
        """At once when another routable shard has its full share; otherwise what the shard asked for (Retry-After),
        at least the first backoff and at most the backoff cap."""
        if any(other is not slot and self._shares.of(other.name) >= 1.0 for other in self._routable):
            return 0.0
        asked = diagnosis.retry_after if diagnosis.retry_after is not None else 0.0
        first = backoff_seconds(self.policy, 1, 0.0)
        return min(self.policy.backoff_max_seconds, max(first, asked))

    def _no_shard(self, run: DispatchRun[Any, Any], state: _PromptState) -> None:
        """No routable shard for a whole healthy wait: the run ends now, whatever the budgets, instead of charging
        every prompt its infra budget against an empty fleet (memory and time that grow with the prompt count)."""
        waited = self.policy.healthy_wait_seconds
        why = self._not_ready_message(1, waited)
        cause = NoHealthyShards(f"no routable shard within {waited:g}s: {why}")
        run.accounts.attempt_ended("infra_failure", state.prompt_id, None, None, diagnose(cause))
        error = RolloutRedispatchExhausted(
            f"no routable shard for {waited:g}s (healthy_wait_seconds): the fleet has no healthy shard to run on: {why}"
        )
        error.__cause__ = cause
        log.error("%s", error)
        run.fail_prompt(state, error)

    def _data_failed(
        self,
        run: DispatchRun[Any, Any],
        state: _PromptState,
        diagnosis: Diagnosis,
        reason: str | None = None,
        *,
        exc: BaseException | None = None,
    ) -> None:
        kind, reason = diagnosis.failure_type, reason or diagnosis.reason
        attempts, shards = state.budget.attempts, tuple(state.tried)
        self._evidence.forget(state.prompt_id)
        outcome = DataFailed(state.prompt_id, state.prompt, FailureClass.DATA, kind, reason, attempts, shards)
        self._give_up(run, state, "data", outcome, exc)

    def _exhausted(
        self, run: DispatchRun[Any, Any], state: _PromptState, exc: BaseException, diagnosis: Diagnosis
    ) -> None:
        run.accounts.exhausted()
        self._evidence.forget(state.prompt_id)
        reason, attempts, shards = diagnosis.reason, state.budget.attempts, tuple(state.tried)
        outcome = Skipped(state.prompt_id, state.prompt, diagnosis.failure_type, reason, attempts, shards)
        self._give_up(run, state, "infra", outcome, exc)

    def _refused(self, run: DispatchRun[Any, Any], state: _PromptState, reason: str) -> None:
        """The prompt forbade another attempt (``retry_refused``): skipped with its reason, under the drop rules."""
        self._evidence.forget(state.prompt_id)
        attempts, shards = state.budget.attempts, tuple(state.tried)
        outcome = Skipped(state.prompt_id, state.prompt, "RetryRefused", reason, attempts, shards)
        self._give_up(run, state, "infra", outcome, None)

    def _give_up(
        self,
        run: DispatchRun[Any, Any],
        state: _PromptState,
        kind: DropKind,
        outcome: DataFailed[Any] | Skipped[Any],
        exc: BaseException | None,
    ) -> None:
        """A budget ran out: report the prompt (and refill its batch position), or end the run (see ``drops``)."""
        if not run.drop_rules:
            run.finish(state, outcome)  # an independent request: its outcome is the whole answer
            return
        decision = decide_drop(
            self.policy,
            self.drops,
            kind,
            size=run.size,
            lost=run.lost,
            replaced=run.replaced[state.position],
            reserve_left=len(run.reserve),
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
            run.fail(error)
            return
        if kind == "data":
            self.drops.skipped_prompts += 1
        else:
            self.drops.consecutive_dropped_prompts += 1
        if isinstance(decision, ReplaceDecision):
            run.replace(state)
        else:
            run.lost += 1
        run.finish(state, outcome)

    # -- health: the source, ejection, eviction --------------------------------------------------------------

    async def _follow(self) -> None:
        iterator = self._source.snapshots()
        try:
            async for snapshot in iterator:
                self._apply(snapshot)
        except Exception:
            log.exception("shard source failed; its last healthy set stays in force")
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()

    def _apply(self, snapshot: HealthySet) -> None:
        fresh = {shard.name: shard for shard in snapshot.shards}
        gone: list[_Slot] = []
        for name, slot in list(self._slots.items()):
            shard = fresh.get(name)
            if shard is None or shard.endpoint != slot.shard.endpoint:
                gone.append(slot)
                del self._slots[name]
            elif shard != slot.shard:
                slot.shard, slot.weight = shard, shard.weight * self._shares.of(name)
        for name in sorted(fresh):
            if name not in self._slots:
                self._slots[name] = _Slot(fresh[name])
                self.metrics.shard_joined(name)
        self._slots = dict(sorted(self._slots.items()))
        self._snapshot = snapshot
        for name in self._ejections.probes_succeeded(snapshot.probe_ok_at, self._now()):
            self._emit(ShardRestored(name, "probe"))
        self._recompute(revision=snapshot.revision)
        self._schedule_expiry()
        for slot in gone:
            for record in list(slot.attempts):
                if not record.evicted:
                    record.evicted = True
                    record.task.cancel(msg=f"shard {slot.name} left the healthy set")

    def _recompute(self, revision: str | None = None) -> None:
        slots = list(self._slots.values())
        routable = [slot for slot in slots if not self._ejections.is_ejected(slot.name)]
        self._panic = not routable and bool(slots)
        if self._panic:
            log.warning("every healthy shard is ejected: routing to all of them (panic mode)")
            routable = slots
        self._routable = routable
        self.metrics.healthy_shards = len(routable)
        self._emit(
            HealthyShardsChanged(
                revision=revision or (self._snapshot.revision if self._snapshot else ""),
                healthy=tuple(self._slots),
                routable=tuple(slot.name for slot in routable),
            )
        )
        self._refresh_pickable()

    def _refresh_pickable(self, now: float | None = None) -> None:
        """Held shards, and one on trial with its one attempt in flight, wait (see ``ejection``); so do attempts when
        no other shard is left. Routable still counts them: they are in rotation and back within the backoff."""
        ejections, now = self._ejections, self._now() if now is None else max(now, self._now())
        self._pickable = [
            slot
            for slot in self._routable
            if not ejections.is_held(slot.name)
            and not (
                slot.trial_attempts
                and self._on_trial(slot.name)
                and slot.trial_attempts >= ejections.trial_room(slot.name, since=slot.trial_started, now=now)[0]
            )
        ]
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _occupy(self, slot: _Slot, record: _Attempt) -> None:
        """An attempt starts on ``slot``. A shard on trial after an ejection takes one at a time: no new attempt starts
        on it until this one ends (see ``ejection``)."""
        slot.outstanding += 1
        slot.attempts.add(record)
        slot.turn_attempts += 1
        if slot.turn_attempts == 1:
            self._fresh.append(slot)
            self._age_soon()
        if self._on_trial(slot.name):
            record.trial = True
            slot.trial_attempts += 1
            now = self._now()
            if slot.trial_attempts == 1:
                slot.trial_started = now
            self._refresh_pickable()
            _, due = self._ejections.trial_room(slot.name, since=slot.trial_started, now=now)
            if due is not None:  # the loop may run a timer a clock resolution early: refresh as of its due time
                self._loop.call_later(due - now, self._refresh_pickable, due)

    async def _next_turn(self, behind: bool) -> None:
        waiter = self._loop.create_future()
        if behind:
            self._turn_waiters.append(waiter)
        else:
            self._turn_waiters.appendleft(waiter)
        self._age_soon()
        await waiter

    def _age_soon(self) -> None:
        if not self._aging:
            self._aging = True
            self._loop.call_soon(self._age)

    def _age(self) -> None:
        """A new turn of the event loop: no shard's attempts are from this turn any more. Wake as many paced attempts
        as the shards can start this turn (not every waiter, which would cost a wake-up per waiter per attempt); the
        rest wait for the next turn."""
        self._aging = False
        for slot in self._fresh:
            slot.turn_attempts = 0
        self._fresh.clear()
        waiters = self._turn_waiters
        wake = len(self._pickable) * _TURN_BUDGET or len(waiters)  # nothing pickable: all go on to wait for one
        while waiters and wake:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                wake -= 1
        if waiters:
            self._age_soon()

    def _on_trial(self, name: str) -> bool:
        """Restored and not yet served, or ejected and routed to anyway in panic mode (see ``ejection``)."""
        ejections = self._ejections
        return ejections.on_trial(name) or (self._panic and ejections.is_ejected(name))

    def _release(self, slot: _Slot, record: _Attempt) -> None:
        slot.outstanding -= 1
        slot.attempts.discard(record)
        if record.trial:
            slot.trial_attempts -= 1
        if not slot.outstanding:
            slot.turn_attempts = 0  # nothing in flight: no answer left unread there to wait for
        if record.trial and not slot.trial_attempts and slot.name in self._slots:
            self._refresh_pickable()

    def _eject(self, run: DispatchRun[Any, Any], name: str, took: float | None) -> None:
        clock, took = self.clock, math.inf if took is None else took
        now, wall = clock.monotonic(), clock.wall()
        ejection = self._ejections.eject(name, now=now, wall=wall, healthy=self._slots.keys(), took=took)
        if ejection is None:
            if name in self._slots:
                self._hold(name, now, wall, took)
            return
        log.info("shard %s ejected for %.1fs (ejection #%d in a row)", name, ejection.seconds, ejection.count)
        run.accounts.ejected(name, ejection)
        self._recompute()
        self._schedule_expiry()

    def _backoff(self, failures: int) -> float:
        """The backoff for the n-th failure in a row, without jitter: how long a held shard waits, and a probe's
        grace before it restores a shard ejected n times in a row."""
        return backoff_seconds(self.policy, failures, 0.0)

    def _hold(self, name: str, now: float, wall: float, took: float) -> None:
        """The panic rule kept ``name`` in rotation: hold it for the backoff instead (see ``ejection``)."""
        seconds = self._ejections.hold(name, now=now, wall=wall, schedule=self._backoff, took=took)
        if seconds is not None:
            log.debug("shard %s held for %.3gs (the panic rule keeps it from being ejected)", name, seconds)
            self.metrics.hold(name)
            self._refresh_pickable()
            self._schedule_expiry()

    def _schedule_expiry(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        due = self._ejections.next_expiry()
        if due is None:
            return

        def expire() -> None:
            self._expiry_timer = None
            # The timer fired for ``due``: the loop may run it a clock resolution early, never late by design.
            held = self._ejections.held
            restored = self._ejections.expire(max(self._now(), due))
            for name in restored:
                self._emit(ShardRestored(name, "expired"))
            if restored:
                self._recompute()
            elif held != self._ejections.held:
                self._refresh_pickable()
            self._schedule_expiry()

        self._expiry_timer = self._loop.call_later(max(0.0, due - self._now()), expire)

    def _emit(self, event: DispatchEvent) -> None:
        if self._observer is None:
            return
        try:
            self._observer(event)
        except Exception:
            log.exception("dispatch observer failed on %r", event)


def _weights_of(source: object) -> WeightsView | None:
    """The source's weights view (``source.weights``, as LocalShardSource has), if it offers one."""
    weights = getattr(source, "weights", None)
    return weights if isinstance(weights, WeightsView) else None
