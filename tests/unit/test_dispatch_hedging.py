"""Opt-in hedging: a second attempt elsewhere after the shard's p99 latency x hedge_factor; first answer wins."""

from __future__ import annotations

import asyncio

import pytest

from rollout_runtime.dispatch import AttemptEnded, Completed, Dispatcher, DispatchEvent, DispatchPolicy
from rollout_runtime.shards import Shard, StaticShardSource
from support.dispatch import assert_accounted, collect, make_shards

POLICY = DispatchPolicy(backoff_initial_seconds=0, backoff_max_seconds=0, healthy_wait_seconds=5, hedge_factor=2)


@pytest.mark.looptime
async def test_a_slow_attempt_is_hedged_and_the_first_answer_wins() -> None:
    slow: list[str] = []
    cancelled: list[str] = []

    async def rollout(shard: Shard, prompt: str) -> str:
        try:
            if prompt == "stuck" and not slow:
                slow.append(shard.name)
                await asyncio.sleep(1000)  # this shard got slow for this one request
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            cancelled.append(shard.name)
            raise
        return shard.name

    events: list[DispatchEvent] = []
    loop = asyncio.get_running_loop()
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), POLICY, observer=events.append) as dispatcher:
        warm = dispatcher.run(["w"] * 20, rollout)
        assert_accounted(warm, await collect(warm), range(20))
        assert warm.stats.hedges == 0, "answers within p99 x 2 are never hedged"
        started = loop.time()
        del events[:]
        run = dispatcher.run(["stuck"], rollout)
        (outcome,) = await collect(run)
        elapsed = loop.time() - started
    assert_accounted(run, [outcome], [0])
    assert isinstance(outcome, Completed)
    assert outcome.shard != slow[0], "the hedge on the other shard answered first"
    assert outcome.result == outcome.shard
    assert cancelled == slow, "the loser was cancelled"
    assert (run.stats.hedges, run.stats.hedges_wasted) == (1, 1)
    assert elapsed < 10  # p99 (1 s) x 2, then the hedge's 1 s; not the 1000 s of the slow attempt
    ended = [(e.shard, e.outcome) for e in events if isinstance(e, AttemptEnded) and e.prompt_id == 0]
    assert sorted(ended) == sorted([(slow[0], "cancelled"), (outcome.shard, "success")]), "two attempts, one wasted"


@pytest.mark.looptime
async def test_without_hedging_the_slow_attempt_is_waited_for() -> None:
    async def rollout(shard: Shard, prompt: str) -> str:
        await asyncio.sleep(100 if prompt == "stuck" else 1)
        return shard.name

    policy = POLICY.model_copy(update={"hedge_factor": None})
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), policy) as dispatcher:
        warm = dispatcher.run(["w"] * 20, rollout)
        await collect(warm)
        run = dispatcher.run(["stuck"], rollout)
        (outcome,) = await collect(run)
    assert isinstance(outcome, Completed)
    assert run.stats.hedges == 0
