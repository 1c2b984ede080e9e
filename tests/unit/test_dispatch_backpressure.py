"""The dispatcher's backpressure: a busy answer teaches the shard's room (``dispatch/gate.py``), and the prompt waits
for room instead of waiting out the Retry-After; on looptime's clock, against in-process shards that cap their
concurrency."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from rollout_runtime.dispatch import AttemptEnded, Completed, Dispatcher, DispatchPolicy
from rollout_runtime.failures import GenerationUnavailable
from rollout_runtime.shards import Shard, StaticShardSource
from support.dispatch import ControlledSource, assert_accounted, collect, make_shards

CAP = 1
"""Generations each shard serves at once; one more is answered 429."""
RETRY_AFTER = 60.0
"""Longer than the whole run takes on the loop's clock: a prompt that waited one out would be refused again."""


class CappedShards:
    """Each shard serves ``CAP`` generations at once (one second each) and answers 429 past them."""

    def __init__(self) -> None:
        self.generating: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        """Busy answers per shard."""
        self.most = 0

    async def rollout(self, shard: Shard, prompt: int) -> int:
        if self.generating[shard.name] >= CAP:
            self.refused[shard.name] += 1
            raise GenerationUnavailable("busy", status=429, retry_after=RETRY_AFTER)
        self.generating[shard.name] += 1
        self.most = max(self.most, self.generating[shard.name])
        try:
            await asyncio.sleep(1.0)  # the generation's time on looptime's clock, not a synchronisation
        finally:
            self.generating[shard.name] -= 1
        return prompt


@pytest.mark.looptime
async def test_a_busy_prompt_queues_for_room_instead_of_waiting_out_the_retry_after() -> None:
    """Ten prompts at once on two shards that each take one: each shard's first refusal teaches its room, and every
    prompt past it then waits at a shard until that shard has room. No shard refuses twice: nothing is sent past a
    learned room, and no refused prompt is sent again after waiting out the Retry-After (it would find the shards as
    full as before)."""
    shards = CappedShards()
    policy = DispatchPolicy(max_concurrency=10, backoff_initial_seconds=0.5, backoff_max_seconds=30)
    prompts = range(10)
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), policy) as dispatcher:
        await dispatcher.wait_ready(2)
        run = dispatcher.run(prompts, shards.rollout)
        outcomes = await collect(run)
    assert_accounted(run, outcomes, prompts)
    assert all(isinstance(outcome, Completed) for outcome in outcomes)
    assert shards.most == CAP
    assert shards.refused == {"a": 1, "b": 1}, "each shard refuses once, which teaches its room"
    assert {name: dispatcher.gate.room.limit(name) for name in ("a", "b")} == {"a": CAP, "b": CAP}


@pytest.mark.looptime
async def test_an_attempt_evicted_while_it_waits_for_room_was_never_an_attempt() -> None:
    """Prompts stand in line for room on shard ``a`` when ``a`` leaves the healthy set: each goes back and completes
    on ``b``, and none is counted as an attempt, a failure or a redispatch (no call reached ``a`` for it). The
    attempt events and the rollout calls agree one to one, which the chaos invariants check on every seed."""
    shards = CappedShards()
    calls: Counter[str] = Counter()

    async def rollout(shard: Shard, prompt: int) -> int:
        calls[shard.name] += 1
        return await shards.rollout(shard, prompt)

    events: list[object] = []
    source = ControlledSource(make_shards("a", "b"))
    policy = DispatchPolicy(max_concurrency=10, backoff_initial_seconds=0.5, backoff_max_seconds=30)
    prompts = range(10)
    async with Dispatcher(source, policy, observer=events.append) as dispatcher:
        await dispatcher.wait_ready(2)
        run = dispatcher.run(prompts, rollout)
        collecting = asyncio.ensure_future(collect(run))
        for _ in range(1000):  # until a's room is learned and prompts stand in its line
            if dispatcher.gate.waiting("a") >= 2:
                break
            await asyncio.sleep(0)
        waiting = dispatcher.gate.waiting("a")
        assert waiting >= 2, f"{waiting} prompts wait for room on a: the eviction below would prove nothing"
        source.publish(make_shards("b"))
        outcomes = await collecting
    assert_accounted(run, outcomes, prompts)
    assert all(isinstance(outcome, Completed) for outcome in outcomes)
    ended = [event for event in events if isinstance(event, AttemptEnded) and event.shard is not None]
    assert Counter(event.shard for event in ended) == calls, "an attempt event without a rollout call, or the reverse"
    failed = sum(1 for event in ended if event.outcome != "success")
    assert run.stats.redispatches == failed, "only failed or evicted attempts that were sent are redispatches"


@pytest.mark.looptime
async def test_a_shard_that_leaves_the_fleet_forgets_its_room() -> None:
    """A shard's learned room is of the process that refused: when the shard leaves the healthy set and comes back
    (a restart may bring another capacity), it starts with no limit and one busy answer teaches it again."""
    shards = CappedShards()
    source = ControlledSource(make_shards("a", "b"))
    policy = DispatchPolicy(max_concurrency=10, backoff_initial_seconds=0.5, backoff_max_seconds=30)
    async with Dispatcher(source, policy) as dispatcher:
        await dispatcher.wait_ready(2)
        outcomes = await collect(dispatcher.run(range(6), shards.rollout))
        assert all(isinstance(outcome, Completed) for outcome in outcomes)
        assert dispatcher.gate.room.limit("a") == CAP, "the run taught a's room (the forgetting below needs one)"
        source.publish(make_shards("b"))
        await dispatcher.wait_ready(1)
        for _ in range(100):  # until the dispatcher has applied the healthy set without a
            if "a" not in dispatcher.outstanding():
                break
            await asyncio.sleep(0)
        assert dispatcher.gate.room.limit("a") is None
