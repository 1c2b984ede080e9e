"""The online API: prompts submitted one at a time into a long-lived session that shares the run's state."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_runtime.dispatch import (
    Completed,
    DataFailed,
    Dispatcher,
    DispatchPolicy,
    Outcome,
    SessionClosed,
    Skipped,
)
from rollout_runtime.failures import (
    GenerationUnavailable,
    NoHealthyShards,
    RolloutDataFailure,
    RolloutRedispatchExhausted,
)
from rollout_runtime.shards import Shard, StaticShardSource
from support.deadlines import within
from support.dispatch import ControlledSource, assert_accounted, echo_rollout, make_shards

FAST = DispatchPolicy(backoff_initial_seconds=0, backoff_max_seconds=0, healthy_wait_seconds=5)


async def test_submissions_complete_one_at_a_time_and_share_the_session_stats() -> None:
    source = StaticShardSource(make_shards("a", "b"))
    async with Dispatcher(source, FAST) as dispatcher, dispatcher.session(echo_rollout()) as session:
        first = await within(session.submit("x"), "the first submission")
        second = await within(session.submit("y", prompt_id="y"), "the second submission")
        assert isinstance(first, Completed)
        assert isinstance(second, Completed)
        assert (first.prompt_id, second.prompt_id) == (0, "y")
        assert (session.stats.submitted, session.stats.completed, session.pending) == (2, 2, 0)
    assert_accounted(session, [first, second], [0, "y"])


async def test_ejection_from_one_submission_steers_the_next() -> None:
    calls: list[str] = []

    async def rollout(shard: Shard, prompt: str) -> str:
        calls.append(shard.name)
        if shard.name == "bad":
            raise GenerationUnavailable("shard bad: connection refused")
        return shard.name

    source = StaticShardSource(make_shards("bad", "good"))
    async with Dispatcher(source, FAST) as dispatcher, dispatcher.session(rollout) as session:
        outcomes = [await within(session.submit(str(i)), "a submission") for i in range(6)]
    assert all(isinstance(o, Completed) and o.shard == "good" for o in outcomes)
    assert calls.count("bad") == 1, "the shard ejected by the first submission was not tried again"


async def test_concurrency_is_bounded_by_the_policy() -> None:
    running = 0
    peak = 0
    release = asyncio.Event()
    three = asyncio.Event()

    async def rollout(shard: Shard, prompt: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 3:
            three.set()
        await release.wait()
        running -= 1
        return prompt

    policy = FAST.model_copy(update={"max_concurrency": 3})
    async with Dispatcher(StaticShardSource(make_shards("a")), policy) as dispatcher, dispatcher.session(rollout) as s:
        futures = [s.submit(i) for i in range(10)]
        await within(three.wait(), "three attempts running")
        await asyncio.sleep(0)
        assert (len(s.workers), s.stats.in_flight) == (3, 3)
        release.set()
        outcomes = await within(asyncio.gather(*futures), "ten submissions")
    assert peak == 3
    assert_accounted(s, list(outcomes), range(10))


async def test_closing_the_session_aborts_pending_prompts_and_refuses_more() -> None:
    async def never(shard: Shard, prompt: int) -> int:
        await asyncio.Event().wait()
        return prompt

    async with Dispatcher(StaticShardSource(make_shards("a")), FAST) as dispatcher:
        session = dispatcher.session(never)
        future = session.submit(1)
        await asyncio.sleep(0)
        await session.aclose()
        with pytest.raises(SessionClosed, match="1 prompt"):
            await future
        with pytest.raises(SessionClosed, match="closed session"):
            session.submit(2)
    assert_accounted(session, [], [0])


async def test_duplicate_pending_ids_are_refused() -> None:
    async def never(shard: Shard, prompt: int) -> int:
        await asyncio.Event().wait()
        return prompt

    async with Dispatcher(StaticShardSource(make_shards("a")), FAST) as dispatcher, dispatcher.session(never) as s:
        s.submit(1, prompt_id="p")
        with pytest.raises(ValueError, match="still pending"):
            s.submit(2, prompt_id="p")


async def test_wait_ready_returns_once_enough_shards_are_routable() -> None:
    source = ControlledSource()
    async with Dispatcher(source, FAST) as dispatcher:
        waiting = asyncio.ensure_future(dispatcher.wait_ready(2, timeout=30))
        source.publish(make_shards("a"))
        await asyncio.sleep(0)
        assert not waiting.done()
        source.publish(make_shards("a", "b"))
        assert await within(waiting, "two shards") == ("a", "b")


@pytest.mark.looptime
async def test_wait_ready_says_how_many_are_missing_when_it_gives_up() -> None:
    source = ControlledSource()
    async with Dispatcher(source, FAST) as dispatcher, dispatcher.session(echo_rollout()) as session:
        source.publish(make_shards("a"))
        with pytest.raises(NoHealthyShards, match=r"1 routable shard\(s\), 3 needed, after 5s"):
            await session.wait_ready(3, timeout=5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    prompts=st.integers(1, 40),
    infra_rate=st.floats(0, 0.6),
    data_rate=st.floats(0, 0.3),
    close_early=st.booleans(),
)
async def test_online_submissions_keep_the_accounting_invariant_under_chaos(
    seed: int, prompts: int, infra_rate: float, data_rate: float, close_early: bool
) -> None:
    """Invariant: every submission resolves once (its outcome, or the session's end), and the session's stats
    satisfy submitted == completed + data_failed + skipped + aborted, whatever fails and whenever it closes."""
    chaos = random.Random(seed)

    async def rollout(shard: Shard, prompt: int) -> int:
        for _ in range(chaos.randrange(3)):
            await asyncio.sleep(0)
        roll = chaos.random()
        if roll < infra_rate:
            raise GenerationUnavailable(f"shard {shard.name}: injected")
        if roll < infra_rate + data_rate:
            raise RolloutDataFailure("injected bad prompt")
        return prompt

    update = {"max_skipped_prompts": 1_000, "max_consecutive_dropped_prompts": 1_000, "max_concurrency": 1 + seed % 8}
    policy = FAST.model_copy(update=update)
    outcomes: list[Outcome[Any, Any]] = []
    async with Dispatcher(StaticShardSource(make_shards("a", "b", "c")), policy, seed=seed) as dispatcher:
        session = dispatcher.session(rollout)
        futures = []
        for index in range(prompts):
            futures.append(session.submit(index))
            if chaos.random() < 0.3:
                await asyncio.sleep(0)
        if close_early:
            await asyncio.sleep(0)
            await session.aclose()
        results = await within(asyncio.gather(*futures, return_exceptions=True), "every submission")
        await session.aclose()
    for result in results:
        if isinstance(result, Completed | DataFailed | Skipped):
            outcomes.append(result)
        else:
            assert isinstance(result, SessionClosed), result
    assert_accounted(session, outcomes, range(prompts))
    assert len(outcomes) + len(session.aborted_ids()) == prompts


SHORT_WAIT = DispatchPolicy(backoff_initial_seconds=0, backoff_max_seconds=0, healthy_wait_seconds=0.05)


async def test_with_fail_prompt_a_submission_with_no_shard_fails_alone_and_the_session_goes_on() -> None:
    source = ControlledSource([])  # a healthy set with no shard: the first submission waits, then finds none
    async with (
        Dispatcher(source, SHORT_WAIT) as dispatcher,
        dispatcher.session(echo_rollout(), drop_rules=False, on_prompt_error="fail_prompt") as session,
    ):
        with pytest.raises(RolloutRedispatchExhausted) as raised:
            await within(session.submit("lonely"), "the submission with no shard")
        assert isinstance(raised.value.__cause__, NoHealthyShards)
        assert session.active, "one submission's run-terminal error ended the whole session"
        source.publish(make_shards("a"))
        await within(dispatcher.wait_ready(1), "shard a routable")
        outcome = await within(session.submit("next"), "a submission once a shard is back")
        assert isinstance(outcome, Completed)
        stats = session.stats
        assert (stats.submitted, stats.completed, stats.aborted, stats.unfinished) == (2, 1, 1, 0)


async def test_by_default_a_submission_with_no_shard_ends_the_session() -> None:
    source = ControlledSource([])
    async with Dispatcher(source, SHORT_WAIT) as dispatcher, dispatcher.session(echo_rollout()) as session:
        with pytest.raises(RolloutRedispatchExhausted):
            await within(session.submit("lonely"), "the submission with no shard")
        assert not session.active
        with pytest.raises(RolloutRedispatchExhausted):
            session.submit("next")


@dataclass(eq=False)
class _Request:
    text: str
    retry_refused: str | None = None


async def test_a_prompt_that_refuses_retries_is_skipped_after_its_failed_attempt() -> None:
    """The router's committed streams: once a prompt says no other shard may answer, a failure is its end."""
    shards_tried: list[str] = []

    async def rollout(shard: Shard, prompt: _Request) -> str:
        shards_tried.append(shard.name)
        prompt.retry_refused = "its answer already reached the client"
        raise GenerationUnavailable(f"shard {shard.name}: dropped mid-answer")

    source = StaticShardSource(make_shards("a", "b"))
    async with Dispatcher(source, FAST) as dispatcher, dispatcher.session(rollout, drop_rules=False) as session:
        outcome = await within(session.submit(_Request("x")), "the refused prompt's outcome")
        again = await within(session.submit(_Request("y")), "a second prompt")
    assert isinstance(outcome, Skipped)
    assert (outcome.failure_type, outcome.reason, outcome.attempts) == (
        "RetryRefused",
        "its answer already reached the client",
        1,
    )
    assert isinstance(again, Skipped)
    assert len(shards_tried) == 2, f"a prompt that refused retries was tried again: {shards_tried}"
    assert session.stats.redispatches == 0
