"""One attempt of one prompt on one shard: its deadline, progress watchdog, hedge and weights check.

:meth:`Attempts.run` calls ``rollout(shard, prompt)`` on a shard the rotation chose and returns how it ended as an
:class:`AttemptEnd`, a value: the result and whether its weights allow committing it, the failure, or that the fleet
ended it (the shard left the healthy set: *evicted*). What follows from that (commit, retry, give up) is the
dispatcher's. Three mechanisms can end an attempt early:

- the attempt timeout (``attempt_timeout_seconds``): a :class:`RolloutTimeout`;
- the progress watchdog (``progress_watchdog``): the rollout reports tokens through
  :func:`~rollout_runtime.dispatch.progress.report_progress`, and a quiet spell longer than the shard's own recent
  timings allow (see ``deadlines``) ends it as a :class:`RolloutTimeout`. Before the first token the allowance is
  the time to first token's; from the first token on, the inter-token gap's: a stream that stalls mid-way is judged
  by the gaps as soon as tokens flow;
- hedging (``hedge_factor``): still running after the shard's p99 latency x the factor, a second attempt starts on
  another shard, and the first answer wins.

Before it calls the rollout, an attempt waits for room on its shard (:class:`~rollout_runtime.dispatch.gate.Gate`,
each shard's room learned from its busy answers; at once on a shard never heard busy), and it hands the room back
with its answer: busy when the answer is a 429 or a 503 with a Retry-After (what ``settle`` calls :class:`Busy`),
with its Retry-After. The wait is the attempt's (its shard's load, evicted with it) but not its time: the attempt
timeout, the progress watchdog and the latency figures start once it has room.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from rollout_runtime.dispatch.accounts import Accounts
from rollout_runtime.dispatch.clock import Clock
from rollout_runtime.dispatch.deadlines import AttemptClock, ShardTimings
from rollout_runtime.dispatch.gate import Gate
from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.dispatch.progress import bind_progress, unbind_progress
from rollout_runtime.dispatch.room import Ticket
from rollout_runtime.dispatch.rotation import Lease, Rotation, Slot
from rollout_runtime.dispatch.run import PromptState, Rollout
from rollout_runtime.failures import Diagnosis, RolloutRedispatchExhausted, RolloutStall, RolloutTimeout, diagnose
from rollout_runtime.weights.gate import WeightsVerdict, WeightsView, weights_verdict

__all__ = ["INTERRUPTS", "AttemptEnd", "Attempts"]

INTERRUPTS = (KeyboardInterrupt, SystemExit)
"""Not an attempt's failure: the run ends with them (every prompt accounted for) and the consumer sees them."""


@dataclass(slots=True, eq=False)
class _Attempt(Lease):
    cancelling: int = 0
    """The task's cancellation requests when the attempt started: more at the end means someone cancelled it."""
    stalled: float | None = None
    """Set to the quiet time allowed when the progress watchdog abandoned the attempt."""
    won_on: Slot | None = None
    """The hedge's shard, when a hedged second attempt answered first."""
    won_started_version: int | None = None
    """The hedge's shard's weights version when the hedge started."""


@dataclass(frozen=True, slots=True)
class _Call:
    """A watched or hedged attempt's parts, passed down together."""

    rollout: Rollout[Any, Any]
    slot: Slot
    state: PromptState
    record: _Attempt
    watch: AttemptClock
    accounts: Accounts


@dataclass(slots=True, eq=False)
class AttemptEnd:
    """How one attempt ended: exactly one of a result (``failure`` None, not ``evicted``), a failure, or an eviction.
    A value the dispatcher reads once (not frozen: one is made per attempt, and a frozen init costs a call per
    field)."""

    slot: Slot
    """The shard it was started on."""
    answered_by: Slot
    """The shard whose answer it is: ``slot``, or the hedge's shard when the hedge answered first."""
    started: float
    """When it started, on the dispatcher's monotonic clock."""
    seconds: float
    result: Any = None
    failure: BaseException | None = None
    diagnosis: Diagnosis | None = None
    """The failure's diagnosis, made once (the room learns from it, and the dispatcher settles it)."""
    evicted: bool = False
    """Its shard left the healthy set: the fleet, not the prompt, ended it."""
    sent: bool = True
    """False when it was evicted while it waited for room on the shard: no rollout call was made, no attempt
    happened (no event, no charge; the prompt simply goes back)."""
    stalled: bool = False
    """The progress watchdog ended it (the watchdog already waited: a retry needs no backoff)."""
    verdict: WeightsVerdict | None = None
    """For a result: whether its weights allow committing it."""
    watch: AttemptClock | None = None


class Attempts:
    """Runs attempts and keeps each shard's recent timings, from which the watchdog and hedging take their
    deadlines."""

    def __init__(self, policy: DispatchPolicy, rotation: Rotation, weights: WeightsView | None) -> None:
        self._policy = policy
        self._rotation = rotation
        self._weights = weights
        self._timings: dict[str, ShardTimings] = {}
        self.gate = Gate()
        """Each shard's room, learned from its busy answers, and the attempts waiting for it."""
        self._clock: Clock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop, clock: Clock) -> None:
        self._loop, self._clock = loop, clock

    def version_of(self, shard: str) -> int | None:
        return self._weights.version_of(shard) if self._weights is not None else None

    async def run(self, rollout: Rollout[Any, Any], slot: Slot, state: PromptState, accounts: Accounts) -> AttemptEnd:
        """One attempt of ``state``'s prompt on ``slot``. Raises what ends the run (an interrupt, a run-terminal error
        the rollout raised) and a cancellation of the worker itself (then counted as abandoned, if it was sent)."""
        task = asyncio.current_task()
        assert task is not None
        record = _Attempt(task, cancelling=task.cancelling())
        rotation, clock = self._rotation, self._bound_clock().monotonic
        rotation.occupy(slot, record)  # waiting for room is load on the shard, and is evicted with it
        accounts.attempt_started()
        try:
            ticket = await self._room(slot, task, record)
            if ticket is None:  # evicted before it was sent: no attempt happened, nothing to account
                return AttemptEnd(slot, slot, clock(), 0.0, evicted=True, sent=False)
            return await self._sent(rollout, slot, state, accounts, task, record, ticket)
        finally:
            rotation.release(slot, record)
            accounts.attempt_stopped()

    async def _room(self, slot: Slot, task: asyncio.Task[Any], record: _Attempt) -> Ticket | None:
        """Wait for room on ``slot``'s shard; None when the shard left the fleet meanwhile."""
        try:
            return await self.gate.enter(slot.name)
        except asyncio.CancelledError:
            if record.evicted and task.uncancel() <= record.cancelling:
                return None
            raise  # the run's end: nothing was sent, so nothing is abandoned

    async def _sent(
        self,
        rollout: Rollout[Any, Any],
        slot: Slot,
        state: PromptState,
        accounts: Accounts,
        task: asyncio.Task[Any],
        record: _Attempt,
        ticket: Ticket,
    ) -> AttemptEnd:
        """The attempt proper, once it has room: its time, timeout and watchdog start here."""
        clock = self._bound_clock().monotonic
        if slot.name not in state.tried:
            state.tried.append(slot.name)
        timeout = self._policy.attempt_timeout_seconds
        started = clock()
        started_version = self._weights.version_of(slot.name) if self._weights is not None else None
        failure: BaseException | None = None
        evicted = False
        result: Any = None
        deadline: asyncio.Timeout | None = None
        watch = self._attempt_clock(slot.name, started)
        try:
            if timeout is None:
                result = await self._watched(rollout, slot, state, record, watch, accounts)
            else:
                async with asyncio.timeout(timeout) as deadline:
                    result = await self._watched(rollout, slot, state, record, watch, accounts)
        except asyncio.CancelledError as exc:
            if task.cancelling() <= record.cancelling:
                failure = exc  # raised by the rollout itself (an inner task's cancellation), not by us: a failure
            elif record.evicted and task.uncancel() <= record.cancelling:
                evicted = True
            else:
                self.gate.leave(ticket)
                accounts.attempt_abandoned()
                raise
        except (RolloutRedispatchExhausted, RolloutStall):
            self.gate.leave(ticket)
            raise
        except INTERRUPTS:
            self.gate.leave(ticket)
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
        diagnosis = diagnose(failure) if failure is not None else None
        self._leave(ticket, diagnosis)
        seconds = clock() - started
        answered_by = record.won_on if record.won_on is not None else slot
        if evicted or failure is not None:
            stalled = record.stalled is not None
            return AttemptEnd(
                slot,
                answered_by,
                started,
                seconds,
                failure=failure,
                diagnosis=diagnosis,
                evicted=evicted,
                stalled=stalled,
            )
        verdict = self._verdict(record, slot, started_version)
        watch = watch if record.won_on is None else None  # a hedge's answer says nothing of this shard's latency
        return AttemptEnd(slot, answered_by, started, seconds, result=result, verdict=verdict, watch=watch)

    def _leave(self, ticket: Ticket, diagnosis: Diagnosis | None) -> None:
        """Hand the room back with the answer: busy (a 429, or a 503 with a Retry-After) teaches the shard's room."""
        if diagnosis is not None and diagnosis.backpressure:
            self.gate.leave(ticket, busy=True, retry_after=diagnosis.retry_after)
        else:
            self.gate.leave(ticket)

    async def _gated(self, slot: Slot, call: _Call) -> Any:
        """A hedge's call on ``slot``: it too waits for room there and hands it back with its answer."""
        ticket = await self.gate.enter(slot.name)
        failure: BaseException | None = None
        try:
            return await call.rollout(slot.shard, call.state.prompt)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._leave(ticket, diagnose(failure) if failure is not None else None)

    def committed(self, end: AttemptEnd) -> None:
        """The attempt's answer is committed: its latency joins its shard's timings."""
        if end.watch is not None:
            end.watch.succeeded(self._bound_clock().monotonic())

    def _attempt_clock(self, shard: str, started: float) -> AttemptClock | None:
        """The attempt's progress deadlines from its shard's recent timings; None without the watchdog or hedging."""
        policy = self._policy
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

    def _watched(
        self,
        rollout: Rollout[Any, Any],
        slot: Slot,
        state: PromptState,
        record: _Attempt,
        watch: AttemptClock | None,
        accounts: Accounts,
    ) -> Awaitable[Any]:
        """The attempt's call: ``rollout(shard, prompt)`` itself when neither the watchdog nor hedging is on (no
        frames of ours between the worker and the rollout), otherwise :meth:`_hedged`."""
        if watch is None:
            return rollout(slot.shard, state.prompt)
        return self._hedged(_Call(rollout, slot, state, record, watch, accounts))

    async def _call(self, call: _Call) -> Any:
        """``rollout(shard, prompt)``, watched for progress when the policy asks: a quiet spell past the deadline ends
        the call with TimeoutError and sets the record's ``stalled``. The check is due when the attempt's clock says;
        a token that brings that time forward (the first one: the gap rule replaces the first-token allowance, which
        is the cap while the shard has few first-token timings) moves the check with it."""
        watch, record = call.watch, call.record
        if not self._policy.progress_watchdog:
            return await call.rollout(call.slot.shard, call.state.prompt)
        loop, now = self._running_loop(), self._bound_clock().monotonic
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
            if watch.due() < checks_at:
                schedule(moment)

        token = bind_progress(progressed)
        try:
            async with quiet:
                schedule(now())
                return await call.rollout(call.slot.shard, call.state.prompt)
        finally:
            unbind_progress(token)
            if handle is not None:
                handle.cancel()

    async def _hedged(self, call: _Call) -> Any:
        """:meth:`_call`, plus opt-in hedging: still running after the shard's p99 latency x ``hedge_factor``, a
        second attempt starts on another shard; the first answer wins and the other is cancelled (wasted)."""
        factor = self._policy.hedge_factor
        timings = self._timings.get(call.slot.name)
        p99 = timings.latency.quantile(0.99) if factor is not None and timings is not None else None
        if p99 is None or factor is None:
            return await self._call(call)
        primary = asyncio.ensure_future(self._call(call))
        try:
            done, _ = await asyncio.wait({primary}, timeout=p99 * factor)
            if done:
                return primary.result()
            other = self._rotation.pick_hedge(call.slot, call.state.tried)
            if other is None:
                return await primary
            return await self._race(call, primary, other)
        finally:
            if not primary.done():
                primary.cancel()
                with contextlib.suppress(BaseException):
                    await primary

    async def _race(self, call: _Call, primary: asyncio.Future[Any], other: Slot) -> Any:
        """Run the hedge on ``other`` against ``primary``: the first success wins; if one fails, wait for the other;
        if both fail, the primary's failure is the attempt's. The extra attempt is accounted as a cancelled one, on the
        loser's shard (the winner's is the attempt's own outcome)."""
        state, record, accounts = call.state, call.record, call.accounts
        clock = self._bound_clock().monotonic
        hedge = asyncio.ensure_future(self._gated(other, call))
        hedge_record = Lease(hedge)
        hedge_version = self.version_of(other.name)
        self._rotation.occupy(other, hedge_record)  # an eviction of the hedge's shard cancels the hedge only
        accounts.attempt_started()
        accounts.hedged()
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
                        accounts.hedge_wasted()
                    if winner is hedge:
                        record.won_on, record.won_started_version = other, hedge_version
                    return winner.result()
            return primary.result()  # both failed: raise the primary's failure
        finally:
            if not hedge.done():
                hedge.cancel()
                with contextlib.suppress(BaseException):
                    await hedge
            self._rotation.release(other, hedge_record)
            accounts.attempt_stopped()
            loser = call.slot.name if record.won_on is other else other.name
            accounts.attempt_ended("cancelled", state.prompt_id, loser, clock() - started)

    def _verdict(self, record: _Attempt, slot: Slot, started_version: int | None) -> WeightsVerdict:
        weights = self._weights
        if weights is None:
            return WeightsVerdict(True, None, None)
        if record.won_on is not None:  # the hedge answered: its own shard's versions decide
            slot, started_version = record.won_on, record.won_started_version
        answered = weights.version_of(slot.name)
        return weights_verdict(weights.policy_version, started_version, answered, self._policy.max_weights_lag)

    def _bound_clock(self) -> Clock:
        assert self._clock is not None, "the dispatcher has not been entered"
        return self._clock

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the dispatcher has not been entered"
        return self._loop
