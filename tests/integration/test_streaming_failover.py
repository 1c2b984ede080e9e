"""Streaming through the dispatcher against real sim shard processes: a frozen stream and a cut one."""

from __future__ import annotations

from rollout_runtime.dispatch import AttemptEnded, Completed, Dispatcher, DispatchEvent, DispatchPolicy
from rollout_runtime.generation import GenerationClient, GenerationOptions
from rollout_runtime.results import Completion
from rollout_runtime.shards import Shard, StaticShardSource
from rollout_runtime.sim import SimFaults, SimFleet
from support.deadlines import within
from support.dispatch import assert_accounted, collect

PACED = SimFaults(token_delay_seconds=0.01)
POLICY = DispatchPolicy(
    backoff_initial_seconds=30,  # a redispatch that comes back sooner did not back off
    backoff_jitter=0,
    attempt_timeout_seconds=120,
    stall_deadline_seconds=600,
    max_concurrency=4,
    progress_watchdog=True,
    progress_factor=8,
    progress_floor_seconds=0.5,
    progress_cap_seconds=30,
)
STREAM = GenerationOptions(stream=True, token_ids=True, logprobs=0)
PROMPT = "echo " + " ".join(f"w{i}" for i in range(12))


async def test_sigstop_mid_stream_is_redispatched_within_the_progress_bound() -> None:
    events: list[DispatchEvent] = []
    async with (
        SimFleet(2, faults={"shard-0": PACED, "shard-1": PACED}) as fleet,
        GenerationClient(timeout_seconds=120) as client,
        Dispatcher(StaticShardSource(fleet.shards), POLICY, observer=events.append) as dispatcher,
    ):
        frozen: list[str] = []

        async def rollout(shard: Shard, prompt: str) -> Completion:
            return await client.complete(shard, prompt, max_tokens=32, options=STREAM)

        warm = dispatcher.run([PROMPT] * 24, rollout)
        assert_accounted(warm, await collect(warm), range(24))

        async def freezing_rollout(shard: Shard, prompt: str) -> Completion:
            if not frozen and shard.name == "shard-0":
                frozen.append(shard.name)
                # SIGSTOP while shard-0 has other streams of this run in flight (4 concurrent, 10 ms per token)
                fleet.hang(shard.name)
            return await client.complete(shard, prompt, max_tokens=32, options=STREAM)

        run = dispatcher.run([PROMPT] * 8, freezing_rollout)
        outcomes = await within(collect(run), "every prompt despite the frozen shard")
        fleet.resume("shard-0")
    assert frozen == ["shard-0"]
    assert_accounted(run, outcomes, range(8))
    assert all(isinstance(o, Completed) and o.shard == "shard-1" for o in outcomes)
    stalled = [e for e in events if isinstance(e, AttemptEnded) and e.shard == "shard-0" and e.outcome != "success"]
    assert stalled, "the frozen attempt ended as a failure"
    assert all(e.failure_type == "RolloutTimeout" for e in stalled)
    # The progress bound: the floor (0.5 s) over 8 x a ~10 ms gap, far below the 120 s attempt timeout.
    assert all(e.seconds < 5 for e in stalled)
    assert run.stats.redispatches >= 1


async def test_a_stream_cut_midway_is_infra_redispatched_and_committed_once() -> None:
    async with (
        SimFleet(2) as fleet,
        GenerationClient(timeout_seconds=30) as client,
        Dispatcher(StaticShardSource(fleet.shards), POLICY.model_copy(update={"backoff_initial_seconds": 0})) as d,
    ):
        await fleet.set_faults("shard-0", drop_next=2)

        async def rollout(shard: Shard, prompt: str) -> Completion:
            return await client.complete(shard, prompt, max_tokens=32, options=STREAM)

        run = d.run([PROMPT] * 6, rollout)
        outcomes = await within(collect(run), "every prompt despite the cut streams")
        dropped = (await fleet.stats("shard-0"))["dropped"]
    assert dropped >= 1, "a stream was really cut"
    assert_accounted(run, outcomes, range(6))
    assert run.stats.infra_failures == dropped
    assert run.stats.completed == 6
    for outcome in outcomes:
        assert isinstance(outcome, Completed)
        assert outcome.result.text == PROMPT
        assert outcome.result.token_ids is not None
        assert len(outcome.result.token_ids) == 13
