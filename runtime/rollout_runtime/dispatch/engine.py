"""The dispatcher: keeps rollouts flowing across a changing fleet and accounts for every prompt exactly once.

The loop, per prompt: pick a routable shard (healthy set minus ejected, weighted least outstanding, never
the shard that just failed it) -> run ``rollout(shard, prompt)`` -> on success commit; on failure classify
(:func:`classify_rollout_failure`) and let the budgets decide: retry (infra: after backoff, elsewhere; data:
at once, elsewhere), data-failed (reported, written to the ledger), or exhausted (skipped, or the run raises
:class:`RolloutRedispatchExhausted`). Workers (``max_concurrency`` of them) pull prompts from a ready queue;
prompts waiting out a backoff sit on a timer, not on a worker.

Health: the dispatcher follows its :class:`ShardSource`. When a shard leaves the healthy set, attempts in
flight on it are cancelled at once and redispatched, so a hung shard costs the probe detection time, not the
attempt timeout. Such an *eviction* is charged to neither budget: the fleet, not the prompt, ended the
attempt, and it cannot loop unboundedly because each one needs a healthy-set transition that the probes'
hysteresis rate-limits. Separately, an infra failure on a shard ejects it passively (see ``ejection``).

Ends: every prompt is handed out exactly once as :class:`Completed`, :class:`DataFailed` or :class:`Skipped`,
or is counted ``aborted`` in :class:`RunStats` when the run raises (RolloutRedispatchExhausted, RolloutStall
with ``stall_action="abort"``) or is closed early. Every task the dispatcher starts is cancelled and awaited
when its run or the dispatcher closes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

from prometheus_client import CollectorRegistry

from rollout_runtime.dispatch.budget import DataFailedDecision, ExhaustedDecision, PromptBudget, decide
from rollout_runtime.dispatch.clock import Clock, LoopClock
from rollout_runtime.dispatch.ejection import EjectionTracker
from rollout_runtime.dispatch.ledger import FailureLedger, LedgerEntry, preview
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
from rollout_runtime.dispatch.selection import ShardLoad, pick_shard
from rollout_runtime.dispatch.watchdog import StallVerdict, StallWatchdog, watch
from rollout_runtime.failures import (
    FailureClass,
    GymTransportError,
    NoHealthyShards,
    RolloutRedispatchExhausted,
    RolloutStall,
    RolloutTerminalDataFailure,
    RolloutTimeout,
    classify_rollout_failure,
    describe_failure,
    failure_contains,
    failure_type,
)
from rollout_runtime.metrics import RolloutMetrics
from rollout_runtime.redaction import safe_message
from rollout_runtime.shards.model import HealthySet, ReportsCompletions, Shard, ShardSource

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


@dataclass(slots=True, eq=False)
class _Slot(ShardLoad):
    attempts: set[_Attempt] = field(default_factory=set)


@dataclass(slots=True, eq=False)
class _PromptState:
    prompt_id: PromptId
    prompt: Any
    budget: PromptBudget = field(default_factory=PromptBudget)
    tried: list[str] = field(default_factory=list)
    last_failed: str | None = None
    done: bool = False


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


_END = _End()


@dataclass(frozen=True, slots=True)
class _RunFailed:
    error: BaseException


def _is_terminal(exc: BaseException) -> bool:
    return failure_contains(exc, RolloutTerminalDataFailure)


def _blames_shard(exc: BaseException) -> bool:
    """Whether an infra failure says the *generation shard* is sick (the environment side's do not)."""
    return not failure_contains(exc, (GymTransportError, NoHealthyShards))


class DispatchRun(Generic[P, R]):
    """One batch of prompts going through the dispatcher: an async iterator of outcomes.

    Iterate it (``async for outcome in run``); it ends when every prompt has an outcome, or raises the
    run-terminal error. ``stats`` is live. Use ``async with`` (or ``aclose()``) to stop a run early;
    otherwise leaving the dispatcher stops it.
    """

    def __init__(self, dispatcher: Dispatcher, states: list[_PromptState], rollout: Rollout[P, R]) -> None:
        self._dispatcher = dispatcher
        self.states = states
        self.rollout = rollout
        self.stats = RunStats(submitted=len(states))
        self.ready: asyncio.Queue[_PromptState | None] = _ReadyQueue()
        self.outcomes: asyncio.Queue[Outcome[P, R] | _End | _RunFailed] = asyncio.Queue()
        self.workers: list[asyncio.Task[None]] = []
        self.watchdog_task: asyncio.Task[None] | None = None
        self.watchdog: StallWatchdog | None = None
        self.timers: set[asyncio.TimerHandle] = set()
        self.error: BaseException | None = None
        self.started = False
        self.closed = False
        self._delivered = False

    @property
    def active(self) -> bool:
        return not self.closed and self.error is None

    def aborted_ids(self) -> list[PromptId]:
        """Prompts that had no outcome when the run raised or was closed early."""
        return [s.prompt_id for s in self.states if not s.done]

    def __aiter__(self) -> DispatchRun[P, R]:
        return self

    async def __anext__(self) -> Outcome[P, R]:
        if self._delivered:
            raise StopAsyncIteration
        if not self.started:
            self._dispatcher._start_run(self)
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

    async def aclose(self) -> None:
        """Stop the run: cancel and await its workers, watchdog and timers; unfinished prompts count aborted."""
        await self._dispatcher._close_run(self)


class Dispatcher:
    """Runs prompts across the healthy shards of a :class:`ShardSource` under a :class:`DispatchPolicy`.

    ::

        async with Dispatcher(source, policy) as dispatcher:
            async for outcome in dispatcher.run(prompts, rollout):
                ...

    ``metrics`` (or a ``registry`` to create them on; default a private one) receives the ``rollout_*``
    metrics; ``observer`` is called synchronously with every :data:`DispatchEvent` (keep it cheap); ``seed``
    makes backoff jitter reproducible; ``clock`` replaces the loop clock in tests.
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
    ) -> None:
        self.policy = policy if policy is not None else DispatchPolicy()
        self.metrics = metrics if metrics is not None else RolloutMetrics(registry)
        self._source = source
        self._completions = source if isinstance(source, ReportsCompletions) else None  # passive liveness
        self._observer = observer
        self._clock: Clock | None = clock
        self._rng = random.Random(seed)
        self._ledger = ledger
        if ledger is None and self.policy.failure_ledger_path is not None:
            self._ledger = FailureLedger(self.policy.failure_ledger_path)
        self._ejections = EjectionTracker(
            self.policy.ejection_base_seconds, self.policy.ejection_max_seconds, self.policy.max_ejection_percent
        )
        self._slots: dict[str, _Slot] = {}
        self._routable: list[_Slot] = []
        self._panic = False
        self._cursor = 0
        self._snapshot: HealthySet | None = None
        self._changed = asyncio.Event()
        self._runs: set[DispatchRun[Any, Any]] = set()
        self._follower: asyncio.Task[None] | None = None
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._entered = False
        self._loop: asyncio.AbstractEventLoop
        self._in_flight = 0

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def __aenter__(self) -> Dispatcher:
        if self._entered:
            raise RuntimeError("a Dispatcher can be entered once")
        self._entered = True
        self._loop = asyncio.get_running_loop()
        if self._clock is None:
            self._clock = LoopClock(self._loop)
        self._follower = asyncio.create_task(self._follow(), name="rollout-dispatch-follow-shards")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every run, the shard-source follower and timers; close the ledger."""
        for run in list(self._runs):
            await self._close_run(run)
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

    # -- public view ----------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> HealthySet | None:
        """The healthy set in force (None until the source yields one)."""
        return self._snapshot

    @property
    def routable(self) -> tuple[str, ...]:
        """Shards attempts go to now: healthy minus ejected (all healthy in panic mode)."""
        return tuple(slot.name for slot in self._routable)

    @property
    def ejected(self) -> frozenset[str]:
        return self._ejections.ejected

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def outstanding(self) -> dict[str, int]:
        """Attempts in flight per healthy shard."""
        return {name: slot.outstanding for name, slot in self._slots.items()}

    def run(
        self,
        prompts: Iterable[P],
        rollout: Rollout[P, R],
        *,
        prompt_ids: Sequence[PromptId] | None = None,
    ) -> DispatchRun[P, R]:
        """Start dispatching ``prompts`` (ids: their positions, or ``prompt_ids``) when first iterated."""
        if not self._entered or self._follower is None:
            raise RuntimeError("use the Dispatcher as `async with Dispatcher(...) as dispatcher:` before run()")
        items = list(prompts)
        ids: Sequence[PromptId] = range(len(items)) if prompt_ids is None else prompt_ids
        if len(ids) != len(items):
            raise ValueError(f"got {len(ids)} prompt_ids for {len(items)} prompts")
        if len(set(ids)) != len(ids):
            raise ValueError("prompt_ids must be unique: each prompt is accounted for exactly once")
        states = [_PromptState(prompt_id=i, prompt=p) for i, p in zip(ids, items, strict=True)]
        run: DispatchRun[P, R] = DispatchRun(self, states, rollout)
        self._runs.add(run)
        return run

    # -- runs -----------------------------------------------------------------------------------------------

    def _start_run(self, run: DispatchRun[Any, Any]) -> None:
        run.started = True
        if not run.states:
            run.outcomes.put_nowait(_END)
            return
        for state in run.states:
            run.ready.put_nowait(state)
        if self.metrics.last_commit_timestamp is None:
            # Progress is measured from the first run's start, so a run that never commits still shows as a stall.
            self.metrics.last_commit_timestamp = self.clock.wall()
        workers = len(run.states)
        if self.policy.max_concurrency is not None:
            workers = min(workers, self.policy.max_concurrency)
        run.workers = [
            asyncio.create_task(self._worker(run), name=f"rollout-dispatch-worker-{i}") for i in range(workers)
        ]
        clock = self._now
        run.watchdog = StallWatchdog(self.policy.stall_deadline_seconds, self.policy.stall_action, now=clock())
        run.watchdog_task = asyncio.create_task(
            watch(
                run.watchdog,
                check_seconds=self.policy.stall_check_seconds,
                clock=clock,
                unfinished=lambda: run.stats.unfinished,
                on_stall=lambda verdict: self._stalled(run, verdict),
            ),
            name="rollout-dispatch-watchdog",
        )

    async def _close_run(self, run: DispatchRun[Any, Any]) -> None:
        if run.closed:
            return
        run.closed = True
        self._runs.discard(run)
        unfinished = run.stats.unfinished
        run.stats.aborted += unfinished
        if run.error is None and unfinished:
            # Wake a consumer still iterating (the dispatcher is closing under it): never a silent, short end.
            run.outcomes.put_nowait(_RunFailed(RuntimeError(f"run closed with {unfinished} unfinished prompt(s)")))
        for handle in run.timers:
            handle.cancel()
        run.timers.clear()
        tasks = [t for t in (*run.workers, run.watchdog_task) if t is not None]
        current = asyncio.current_task()
        for task in tasks:
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in tasks if t is not current), return_exceptions=True)

    def _fail_run(self, run: DispatchRun[Any, Any], error: BaseException) -> None:
        """End the run with ``error``: outcomes already queued are still delivered, then it raises."""
        if not run.active:
            return
        run.error = error
        run.stats.aborted += run.stats.unfinished
        run.outcomes.put_nowait(_RunFailed(error))
        for handle in run.timers:
            handle.cancel()
        run.timers.clear()
        current = asyncio.current_task()
        for task in (*run.workers, run.watchdog_task):
            if task is not None and task is not current:
                task.cancel()

    def _finish(self, run: DispatchRun[Any, Any], state: _PromptState, outcome: Outcome[Any, Any]) -> None:
        state.done = True
        run.outcomes.put_nowait(outcome)
        if run.stats.unfinished == 0:
            run.outcomes.put_nowait(_END)
            for _ in run.workers:
                run.ready.put_nowait(None)

    def _commit(self) -> None:
        self.metrics.last_commit_timestamp = self.clock.wall()

    def _requeue(self, run: DispatchRun[Any, Any], state: _PromptState, delay: float) -> None:
        run.stats.redispatches += 1
        self.metrics.redispatches += 1
        if delay <= 0:
            run.ready.put_nowait(state)
            return

        def ready_again() -> None:
            run.timers.discard(handle)
            if run.active:
                run.ready.put_nowait(state)

        handle = self._loop.call_later(delay, ready_again)
        run.timers.add(handle)

    def _stalled(self, run: DispatchRun[Any, Any], verdict: StallVerdict) -> None:
        run.stats.stalls += 1
        self.metrics.stalls[verdict.action] += 1
        self._emit(StallDetected(verdict.action, verdict.idle_seconds, verdict.unfinished))
        log.warning("%s", verdict.message())
        if verdict.action == "abort":
            self._fail_run(run, RolloutStall(verdict.message()))

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
        except (RolloutRedispatchExhausted, RolloutStall) as exc:  # raised by the rollout itself: run-terminal
            self._fail_run(run, exc)
        except Exception as exc:  # a bug in an observer, the ledger's disk...: the run ends loudly
            log.exception("dispatcher worker failed")
            self._fail_run(run, exc)

    def _pick(self, state: _PromptState) -> _Slot | None:
        routable = self._routable
        if not routable:
            return None
        self._cursor += 1
        return pick_shard(routable, start=self._cursor, last_failed=state.last_failed, tried=state.tried)

    async def _wait_for_shard(self, state: _PromptState) -> _Slot | None:
        # One absolute deadline on the loop's clock. Recomputing "deadline - now" each turn can leave a remainder
        # below the clock's resolution (1e-15 s) that is due at once forever: a spin that never lets time move.
        try:
            async with asyncio.timeout(self.policy.healthy_wait_seconds):
                while (slot := self._pick(state)) is None:
                    await self._changed.wait()
        except TimeoutError:
            return self._pick(state)
        return slot

    async def _attempt(self, run: DispatchRun[Any, Any], state: _PromptState) -> None:
        slot = self._pick(state)
        if slot is None:
            slot = await self._wait_for_shard(state)
            if not run.active:
                return
            if slot is None:
                waited = self.policy.healthy_wait_seconds
                self._failed(run, state, None, NoHealthyShards(f"no routable shard within {waited:g}s"), None)
                return
        task = asyncio.current_task()
        assert task is not None
        record = _Attempt(task, task.cancelling())
        slot.outstanding += 1
        slot.attempts.add(record)
        self._in_flight += 1
        self.metrics.in_flight += 1
        run.stats.in_flight += 1
        if slot.name not in state.tried:
            state.tried.append(slot.name)
        timeout = self.policy.attempt_timeout_seconds
        clock = self.clock.monotonic
        started = clock()
        failure: BaseException | None = None
        evicted = False
        result: Any = None
        deadline: asyncio.Timeout | None = None
        try:
            try:
                if timeout is None:
                    result = await run.rollout(slot.shard, state.prompt)
                else:
                    async with asyncio.timeout(timeout) as deadline:
                        result = await run.rollout(slot.shard, state.prompt)
            except asyncio.CancelledError:
                if record.evicted and task.uncancel() <= record.cancelling:
                    evicted = True
                else:
                    run.stats.cancelled += 1
                    self.metrics.attempt("cancelled")
                    raise
            except (RolloutRedispatchExhausted, RolloutStall):
                raise
            except TimeoutError as exc:
                failure = exc
                if deadline is not None and deadline.expired():
                    failure = RolloutTimeout(f"attempt exceeded {timeout:g}s on shard {slot.name}")
                    failure.__cause__ = exc
            except Exception as exc:
                failure = exc
            else:
                if record.evicted:
                    task.uncancel()  # the rollout swallowed the cancellation; its result still stands
        finally:
            slot.outstanding -= 1
            slot.attempts.discard(record)
            self._in_flight -= 1
            self.metrics.in_flight -= 1
            run.stats.in_flight -= 1
        ended = clock()
        if not run.active:
            return
        if evicted:
            self._evicted(run, state, slot, ended - started)
        elif failure is not None:
            self._failed(run, state, slot, failure, ended - started)
        else:
            self._succeeded(run, state, slot, result, started, ended)

    def _succeeded(
        self, run: DispatchRun[Any, Any], state: _PromptState, slot: _Slot, result: Any, started: float, ended: float
    ) -> None:
        seconds = ended - started
        metrics = self.metrics
        run.stats.successes += 1
        run.stats.completed += 1
        metrics.attempt("success", seconds)
        metrics.prompts["completed"] += 1
        if self._completions is not None:
            self._completions.attempt_succeeded(slot.name)
        self._commit()
        if run.watchdog is not None:
            run.watchdog.committed(ended)
        if self._observer is not None:
            self._emit(AttemptEnded(state.prompt_id, slot.name, "success", None, seconds))
        attempts = state.budget.attempts + 1
        self._finish(run, state, Completed(state.prompt_id, state.prompt, result, attempts, slot.name))

    def _evicted(self, run: DispatchRun[Any, Any], state: _PromptState, slot: _Slot, seconds: float) -> None:
        run.stats.cancelled += 1
        self.metrics.attempt("cancelled", seconds)
        state.budget.evictions += 1
        state.last_failed = slot.name
        self._emit(AttemptEnded(state.prompt_id, slot.name, "cancelled", None, seconds))
        self._requeue(run, state, 0.0)

    def _failed(
        self,
        run: DispatchRun[Any, Any],
        state: _PromptState,
        slot: _Slot | None,
        exc: BaseException,
        seconds: float | None,
    ) -> None:
        metrics = self.metrics
        failure_class = classify_rollout_failure(exc)
        kind = failure_type(exc)
        metrics.failure(failure_class.value, kind)
        outcome: Literal["infra_failure", "data_failure"]
        if failure_class is FailureClass.INFRA:
            outcome = "infra_failure"
            state.budget.infra_failures += 1
            run.stats.infra_failures += 1
        else:
            outcome = "data_failure"
            state.budget.data_failures += 1
            run.stats.data_failures += 1
        metrics.attempt(outcome, seconds)
        if slot is not None:
            state.last_failed = slot.name
        if self._observer is not None:
            self._emit(AttemptEnded(state.prompt_id, slot.name if slot else None, outcome, kind, seconds or 0.0))
        if failure_class is FailureClass.INFRA and slot is not None and _blames_shard(exc):
            self._eject(run, slot.name)
        decision = decide(self.policy, state.budget, failure_class, terminal=_is_terminal(exc), draw=self._rng.random())
        if isinstance(decision, DataFailedDecision):
            self._data_failed(run, state, exc, failure_class, kind)
        elif isinstance(decision, ExhaustedDecision):
            self._exhausted(run, state, exc, kind)
        else:
            self._requeue(run, state, decision.delay_seconds)

    def _data_failed(
        self, run: DispatchRun[Any, Any], state: _PromptState, exc: BaseException, cls: FailureClass, kind: str
    ) -> None:
        reason = _reason(exc)
        attempts = state.budget.attempts
        run.stats.data_failed += 1
        self.metrics.prompts["data_failed"] += 1
        self._commit()
        if run.watchdog is not None:
            run.watchdog.committed(self.clock.monotonic())
        log.warning("prompt %s data-failed after %d attempt(s): %s", state.prompt_id, attempts, reason)
        self._write_ledger(state, "data_failed", cls, kind, reason)
        outcome = DataFailed(state.prompt_id, state.prompt, cls, kind, reason, attempts, tuple(state.tried))
        self._finish(run, state, outcome)

    def _exhausted(self, run: DispatchRun[Any, Any], state: _PromptState, exc: BaseException, kind: str) -> None:
        run.stats.exhausted += 1
        self.metrics.exhausted += 1
        reason = _reason(exc)
        attempts = state.budget.attempts
        shards = tuple(state.tried)
        if run.stats.skipped < self.policy.max_skipped_prompts:
            run.stats.skipped += 1
            self.metrics.prompts["skipped"] += 1
            log.warning("prompt %s skipped after %d attempt(s): %s", state.prompt_id, attempts, reason)
            self._write_ledger(state, "skipped", FailureClass.INFRA, kind, reason)
            self._finish(run, state, Skipped(state.prompt_id, state.prompt, kind, reason, attempts, shards))
            return
        error = RolloutRedispatchExhausted(
            f"prompt {state.prompt_id!r} failed {state.budget.infra_failures} infra attempt(s) on shards "
            f"{list(shards)}; last: {reason}"
        )
        error.__cause__ = exc
        log.error("%s", error)
        self._fail_run(run, error)

    def _write_ledger(self, state: _PromptState, result: Any, cls: FailureClass, kind: str, reason: str) -> None:
        if self._ledger is None:
            return
        self._ledger.write(
            LedgerEntry(
                prompt_id=state.prompt_id,
                result=result,
                failure_class=cls.value,
                failure_type=kind,
                reason=reason,
                attempts=state.budget.attempts,
                shards=tuple(state.tried),
                time=self.clock.wall(),
                prompt_preview=preview(state.prompt),
            )
        )

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
                slot.shard, slot.weight = shard, shard.weight
        for name in sorted(fresh):
            if name not in self._slots:
                self._slots[name] = _Slot(fresh[name])
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
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _eject(self, run: DispatchRun[Any, Any], name: str) -> None:
        clock = self.clock
        ejection = self._ejections.eject(name, now=clock.monotonic(), wall=clock.wall(), healthy=self._slots.keys())
        if ejection is None:
            return
        run.stats.ejections += 1
        self.metrics.ejection(name)
        log.info("shard %s ejected for %.1fs (ejection #%d in a row)", name, ejection.seconds, ejection.count)
        self._emit(ShardEjected(name, ejection.seconds, ejection.count))
        self._recompute()
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
            restored = self._ejections.expire(max(self._now(), due))
            for name in restored:
                self._emit(ShardRestored(name, "expired"))
            if restored:
                self._recompute()
            self._schedule_expiry()

        self._expiry_timer = self._loop.call_later(max(0.0, due - self._now()), expire)

    def _emit(self, event: DispatchEvent) -> None:
        if self._observer is None:
            return
        try:
            self._observer(event)
        except Exception:
            log.exception("dispatch observer failed on %r", event)


def _reason(exc: BaseException) -> str:
    """The failure's message with the causes that explain it, bounded (vLLM's 400 body lands here)."""
    return safe_message(describe_failure(exc))
