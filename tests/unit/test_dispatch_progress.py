"""The progress watchdog: an attempt whose shard goes quiet is abandoned by its own timings, not the attempt timeout."""

from __future__ import annotations

import asyncio

import pytest

from rollout_runtime.dispatch import AttemptEnded, Completed, Dispatcher, DispatchEvent, DispatchPolicy
from rollout_runtime.dispatch.progress import report_progress
from rollout_runtime.shards import Shard, StaticShardSource
from support.dispatch import assert_accounted, collect, make_shards

# A retry after a failure would wait 20 s (no jitter): a redispatch that takes less did not back off.
POLICY = DispatchPolicy(
    backoff_initial_seconds=20,
    backoff_jitter=0,
    healthy_wait_seconds=5,
    attempt_timeout_seconds=600,
    stall_deadline_seconds=3600,
    progress_watchdog=True,
    progress_factor=4,
    progress_floor_seconds=0.2,
    progress_cap_seconds=30,
)


async def stream_tokens(count: int, gap: float) -> None:
    for _ in range(count):
        await asyncio.sleep(gap)
        report_progress()


class FreezingStream:
    """A rollout that streams 10 tokens 10 ms apart; once ``frozen`` is set, the next stream stops after 3 tokens
    (SIGSTOP-like) and ``froze_on`` names its shard."""

    def __init__(self) -> None:
        self.frozen = asyncio.Event()
        self.froze_on: list[str] = []

    async def __call__(self, shard: Shard, prompt: object) -> str:
        await stream_tokens(3, 0.01)
        if self.frozen.is_set() and not self.froze_on:
            self.froze_on.append(shard.name)
            await asyncio.Event().wait()  # the shard stopped mid-stream
        await stream_tokens(7, 0.01)
        return shard.name


@pytest.mark.looptime
async def test_a_stream_that_freezes_is_redispatched_at_once_within_its_progress_bound() -> None:
    rollout = FreezingStream()
    frozen, froze_on = rollout.frozen, rollout.froze_on

    events: list[DispatchEvent] = []
    loop = asyncio.get_running_loop()
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), POLICY, observer=events.append) as dispatcher:
        warm = dispatcher.run(range(20), rollout)
        assert_accounted(warm, await collect(warm), range(20))
        frozen.set()
        started = loop.time()
        run = dispatcher.run(["p"], rollout, prompt_ids=["p"])
        outcomes = await collect(run)
        elapsed = loop.time() - started
    assert_accounted(run, outcomes, ["p"])
    stalled = [e for e in events if isinstance(e, AttemptEnded) and e.failure_type == "RolloutTimeout"]
    assert [e.shard for e in stalled] == froze_on, "the frozen attempt was abandoned as a RolloutTimeout"
    assert stalled[0].seconds < 0.5  # 3 tokens, then at most the floor-clamped 4 x 10 ms gap
    done = outcomes[0]
    assert isinstance(done, Completed)
    assert done.shard != froze_on[0]
    assert done.attempts == 2
    assert elapsed < 1.0, "redispatched without the 20 s backoff"
    assert froze_on[0] in dispatcher.ejected


@pytest.mark.looptime
async def test_a_cold_shard_gets_the_cap_and_an_answer_within_it_stands() -> None:
    async def rollout(shard: Shard, prompt: int) -> int:
        await asyncio.sleep(10)  # not streamed: nothing reported until the answer
        return prompt

    async with Dispatcher(StaticShardSource(make_shards("a")), POLICY) as dispatcher:
        run = dispatcher.run(range(3), rollout)
        outcomes = await collect(run)
    assert_accounted(run, outcomes, range(3))
    assert run.stats.infra_failures == 0


@pytest.mark.looptime
async def test_without_the_watchdog_a_quiet_attempt_waits_for_its_answer() -> None:
    async def rollout(shard: Shard, prompt: int) -> int:
        report_progress()  # outside a watched attempt: a no-op
        await asyncio.sleep(100)
        return prompt

    policy = POLICY.model_copy(update={"progress_watchdog": False})
    async with Dispatcher(StaticShardSource(make_shards("a")), policy) as dispatcher:
        run = dispatcher.run([1], rollout)
        outcomes = await collect(run)
    assert isinstance(outcomes[0], Completed)
    assert run.stats.infra_failures == 0


@pytest.mark.looptime
async def test_a_stream_that_stalls_mid_way_is_judged_by_its_gaps_before_the_first_token_timings_are_known() -> None:
    """A few warm-up streams give each shard many inter-token gaps but fewer first-token timings than the deadlines
    need, so the time to the first token is still the cap. Once tokens flow, the quiet time allowed is the gap rule's:
    the frozen stream is abandoned long before the cap, not when the cap's check would have come."""
    rollout = FreezingStream()
    frozen, froze_on = rollout.frozen, rollout.froze_on

    events: list[DispatchEvent] = []
    source = StaticShardSource(make_shards("a", "b"))
    async with Dispatcher(source, POLICY, observer=events.append) as dispatcher:
        for n in range(6):  # one at a time, over both shards: 3 first-token timings and 27 gaps each
            warm = dispatcher.run([n], rollout, prompt_ids=[n])
            assert_accounted(warm, await collect(warm), [n])
        frozen.set()
        run = dispatcher.run(["p"], rollout, prompt_ids=["p"])
        outcomes = await collect(run)
    assert_accounted(run, outcomes, ["p"])
    stalled = [e for e in events if isinstance(e, AttemptEnded) and e.failure_type == "RolloutTimeout"]
    assert [e.shard for e in stalled] == froze_on, "the frozen attempt was abandoned as a RolloutTimeout"
    gap_allowance = POLICY.progress_floor_seconds  # 4 x a 10 ms gap is below the floor
    assert stalled[0].seconds <= 3 * 0.01 + gap_allowance + 0.01, "abandoned by the gap rule, not the first-token cap"
    assert isinstance(outcomes[0], Completed)
