"""Nothing lost, ever: whatever a rollout raises and however the consumer leaves, every prompt is accounted once."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Literal

import looptime
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_runtime.dispatch import Completed, DataFailed, Dispatcher, DispatchPolicy, DispatchRun
from rollout_runtime.failures import GenerationUnavailable, RolloutDataFailure
from rollout_runtime.shards import Shard
from support.deadlines import deadline
from support.dispatch import ControlledSource, assert_accounted, make_shards

Action = Literal["ok", "infra", "data", "cancelled", "generator_exit", "base", "keyboard", "exit", "hang"]
ACTIONS: tuple[Action, ...] = ("ok", "infra", "data", "cancelled", "generator_exit", "base", "keyboard", "exit", "hang")
Leave = Literal["never", "break", "raise", "cancel"]


class LibraryAbort(BaseException):
    """A library's own BaseException (not Exception): it must end one attempt, not the worker."""


class ConsumerBug(Exception):
    pass


async def attempt(action: Action, shard: Shard, prompt: int) -> tuple[int, str]:
    await asyncio.sleep(0)  # let other attempts interleave
    if action == "infra":
        raise GenerationUnavailable(f"{shard.name} refused")
    if action == "data":
        raise RolloutDataFailure(f"prompt {prompt} is too long")
    if action == "cancelled":
        raise asyncio.CancelledError("an inner task of the rollout was cancelled")
    if action == "generator_exit":
        raise GeneratorExit
    if action == "base":
        raise LibraryAbort("a library gave up")
    if action == "keyboard":
        raise KeyboardInterrupt
    if action == "exit":
        raise SystemExit(3)
    if action == "hang":
        await asyncio.Event().wait()
    return prompt, shard.name


async def consume(run: DispatchRun[Any, Any], leave: Leave, after: int) -> tuple[list[Any], BaseException | None]:
    """Iterate the run; leave it early the ``leave`` way after ``after`` outcomes (never: to the end)."""
    outcomes: list[Any] = []

    interrupts: list[BaseException] = []

    async def iterate() -> None:
        try:
            async for outcome in run:
                outcomes.append(outcome)
                if leave != "never" and len(outcomes) >= after:
                    if leave == "break":
                        break
                    if leave == "raise":
                        raise ConsumerBug("the trainer's loop body failed")
                    await asyncio.Event().wait()  # "cancel": the consumer is cancelled while it waits
        except (KeyboardInterrupt, SystemExit) as exc:  # from the run; a task re-raising them would stop the loop
            interrupts.append(exc)

    error: BaseException | None = None
    task = asyncio.create_task(iterate())
    try:
        if leave == "cancel":
            async with deadline("the consumer to reach its outcome", 60):
                while len(outcomes) < after and not task.done():
                    await asyncio.wait({task}, timeout=1)
            task.cancel()
        await task
    except (asyncio.CancelledError, Exception) as exc:
        error = exc
    if interrupts:
        error = interrupts[0]
    async with deadline(lambda: f"the run to close ({run.stats})", 60):
        await run.wait_closed()
    return outcomes, error


async def run_schedule(
    schedule: list[list[Action]], shards: int, policy: DispatchPolicy, leave: Leave, after: int
) -> tuple[list[Any], BaseException | None, DispatchRun[Any, Any], Counter[str]]:
    source = ControlledSource(make_shards(*(f"s{i}" for i in range(shards))))
    attempts: Counter[int] = Counter()
    seen: Counter[str] = Counter()

    async def rollout(shard: Shard, prompt: int) -> tuple[int, str]:
        index = attempts[prompt]
        attempts[prompt] += 1
        actions = schedule[prompt]
        action = actions[index] if index < len(actions) else "ok"
        seen[action] += 1
        return await attempt(action, shard, prompt)

    async with Dispatcher(source, policy, seed=0) as dispatcher:
        run = dispatcher.run(range(len(schedule)), rollout)
        outcomes, error = await consume(run, leave, after)
    return outcomes, error, run, seen


schedules = st.lists(st.lists(st.sampled_from(ACTIONS), max_size=4), min_size=1, max_size=8)
policies = st.builds(
    DispatchPolicy,
    max_infra_attempts=st.integers(1, 3),
    max_data_attempts=st.integers(1, 3),
    max_skipped_prompts=st.integers(0, 8),
    max_consecutive_dropped_prompts=st.integers(0, 8),
    min_step_batch_fraction=st.sampled_from([0.01, 0.5, 1.0]),
    max_concurrency=st.none() | st.integers(1, 3),
    backoff_initial_seconds=st.just(0.0),
    backoff_max_seconds=st.just(0.0),
    healthy_wait_seconds=st.just(1.0),
    attempt_timeout_seconds=st.just(5.0),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schedule=schedules,
    shards=st.integers(1, 3),
    policy=policies,
    leave=st.sampled_from(["never", "break", "raise", "cancel"]),
    after=st.integers(1, 4),
)
def test_the_accounting_invariant_holds_whatever_is_raised_and_however_the_consumer_leaves(
    schedule: list[list[Action]], shards: int, policy: DispatchPolicy, leave: Leave, after: int
) -> None:
    """For any schedule of per-attempt endings (success, infra, data, a rollout's own CancelledError, GeneratorExit,
    another BaseException, KeyboardInterrupt, SystemExit, a hang cut by the attempt timeout) and any way out of the
    ``async for`` (to the end, break, an exception in the loop body, a cancelled consumer), once the run has closed:
    each prompt is delivered at most once, delivered + aborted = all prompts, nothing is left in flight, and
    outcomes queued but never delivered count as aborted, not completed. KeyboardInterrupt and SystemExit end the run
    and reach the consumer; every other BaseException ends one attempt only."""
    loop = looptime.new_event_loop()
    try:
        outcomes, error, run, seen = loop.run_until_complete(run_schedule(schedule, shards, policy, leave, after))
    finally:
        loop.close()
    assert_accounted(run, outcomes, range(len(schedule)))
    assert run.closed
    interrupted = seen["keyboard"] + seen["exit"]
    if isinstance(error, KeyboardInterrupt | SystemExit):
        assert interrupted, "an interrupt reached the consumer that no rollout raised"
    if leave == "never" and not interrupted and error is None:
        assert len(outcomes) == len(schedule), "a run that ended normally delivered every prompt"
    if leave == "raise" and len(outcomes) >= after:
        assert isinstance(error, ConsumerBug)
    for outcome in outcomes:
        if isinstance(outcome, DataFailed):
            assert outcome.reason


@pytest.mark.looptime
async def test_a_rollout_raising_cancelled_error_fails_its_attempt_instead_of_losing_the_prompt() -> None:
    """Regression: the worker died with it, the prompt was never accounted for, and a warn-only run hung forever."""
    raised = Counter[str]()

    async def rollout(shard: Shard, prompt: int) -> int:
        if prompt == 0 and not raised:
            raised["cancelled"] += 1
            raise asyncio.CancelledError("an inner task was cancelled")
        return prompt

    policy = DispatchPolicy(backoff_initial_seconds=0, backoff_max_seconds=0, stall_action="warn")
    async with Dispatcher(ControlledSource(make_shards("a", "b")), policy) as dispatcher:
        run = dispatcher.run(range(3), rollout)
        outcomes, error = await consume(run, "never", 0)
    assert raised["cancelled"] == 1, "the fault was never injected"
    assert error is None
    assert sorted(o.prompt_id for o in outcomes if isinstance(o, Completed)) == [0, 1, 2]
    assert run.stats.data_failures == 1, "the CancelledError was one failed attempt (unknown: DATA), then a retry"


@pytest.mark.looptime
async def test_keyboard_interrupt_in_a_rollout_ends_the_run_with_every_prompt_accounted() -> None:
    async def rollout(shard: Shard, prompt: int) -> int:
        if prompt == 2:
            raise KeyboardInterrupt
        await asyncio.Event().wait()
        return prompt

    async with Dispatcher(ControlledSource(make_shards("a")), DispatchPolicy()) as dispatcher:
        run = dispatcher.run(range(5), rollout)
        outcomes, error = await consume(run, "never", 0)
    assert isinstance(error, KeyboardInterrupt)
    assert outcomes == []
    assert (run.stats.aborted, run.stats.in_flight) == (5, 0)


@pytest.mark.looptime
async def test_breaking_out_of_the_stream_cancels_attempts_and_aborts_undelivered_outcomes() -> None:
    """No ``aclose()`` by hand: leaving the ``async for`` closes the run; the queued outcomes are aborted."""
    cancelled: list[int] = []
    waiting: list[int] = []
    all_waiting = asyncio.Event()

    async def rollout(shard: Shard, prompt: int) -> int:
        if prompt >= 3:
            waiting.append(prompt)
            if len(waiting) == 3:
                all_waiting.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(prompt)
                raise
        await all_waiting.wait()  # the outcomes come once every long attempt is in flight
        return prompt

    async with Dispatcher(ControlledSource(make_shards("a")), DispatchPolicy()) as dispatcher:
        run = dispatcher.run(range(6), rollout)
        outcomes, error = await consume(run, "break", 1)
        assert run.closed, "the run closed before the dispatcher did"
    assert error is None
    assert len(outcomes) == 1
    assert sorted(cancelled) == [3, 4, 5], "the attempts in flight were cancelled"
    assert (run.stats.completed, run.stats.aborted) == (1, 5), "two queued outcomes were never delivered: aborted"
    assert_accounted(run, outcomes, range(6))
