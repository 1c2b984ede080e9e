"""A prompt coming back for another attempt goes before fresh prompts (found by bench/failover.py: a retry queued
behind the whole batch made the p99 prompt latency 26 s under chaos)."""

from __future__ import annotations

from typing import Any

from rollout_runtime.dispatch import Completed, Dispatcher, DispatchPolicy
from rollout_runtime.failures import GenerationUnavailable, RolloutDataFailure
from rollout_runtime.shards import Shard, StaticShardSource
from support.dispatch import AttemptLog, collect, make_shards


def failing_once(fail: dict[str, BaseException], log: AttemptLog) -> Any:
    """A rollout that fails the first attempt of each prompt named in ``fail`` with the given error."""

    async def rollout(shard: Shard, prompt: str) -> str:
        log.calls.append((prompt, shard.name))
        error = fail.pop(prompt, None)
        if error is not None:
            raise error
        return prompt

    return rollout


async def test_an_infra_retry_runs_before_the_fresh_prompts_still_waiting() -> None:
    log = AttemptLog()
    policy = DispatchPolicy(max_concurrency=1, backoff_initial_seconds=0, backoff_max_seconds=0)
    rollout = failing_once({"a": GenerationUnavailable("503", status=503)}, log)
    async with Dispatcher(StaticShardSource(make_shards("s0", "s1")), policy) as dispatcher:
        outcomes = await collect(dispatcher.run(["a", "b", "c", "d"], rollout))
    assert [prompt for prompt, _ in log.calls] == ["a", "a", "b", "c", "d"]
    assert all(isinstance(o, Completed) for o in outcomes)


async def test_a_data_retry_also_runs_before_fresh_prompts_and_fresh_prompts_keep_their_order() -> None:
    log = AttemptLog()
    policy = DispatchPolicy(max_concurrency=1, backoff_initial_seconds=0, backoff_max_seconds=0)
    fail: dict[str, BaseException] = {"a": RolloutDataFailure("bad"), "b": GenerationUnavailable("reset")}
    async with Dispatcher(StaticShardSource(make_shards("s0", "s1")), policy) as dispatcher:
        outcomes = await collect(dispatcher.run(["a", "b", "c"], failing_once(fail, log)))
    assert [prompt for prompt, _ in log.calls] == ["a", "a", "b", "b", "c"]
    assert sorted(o.prompt for o in outcomes if isinstance(o, Completed)) == ["a", "b", "c"]
