"""vLLM's error answers, classified and blamed as docs/failures.md and docs/blame.md say, on the shared servers.

- a prompt longer than the context: 400 ``parameter=input_tokens`` -> DATA, confirmed on the second server, no
  ejection;
- a bad parameter (``max_tokens: -5``): 400 -> DATA, the poison prompt ejects no shard and ends no run;
- an unknown model: 404 "does not exist" on one shard while the other serves -> that shard is the sick one (ejected,
  no prompt charged);
- the router in front of real vLLM relays vLLM's answers (completions, a stream with its usage chunk, the 400).
"""

from __future__ import annotations

from typing import Any

from rollout_runtime.dispatch import Dispatcher, DispatchPolicy
from rollout_runtime.failures import FailureClass, RolloutDataFailure, classify_rollout_failure
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import Shard
from rollout_runtime.vllm import MAX_MODEL_LEN, MODEL_NAME, VllmServer
from support.dispatch import ControlledSource, assert_accounted, by_kind, collect_until_error
from support.routing import through_the_router

POLICY = DispatchPolicy(
    backoff_initial_seconds=0.05,
    backoff_max_seconds=0.2,
    ejection_base_seconds=60,
    max_concurrency=4,
    max_skipped_prompts=2,
    min_step_batch_fraction=0.5,
)
TOO_LONG = " the" * (MAX_MODEL_LEN + 20)
BAD_PARAMETER = "a prompt sent with max_tokens -5"


def shards_of(servers: list[VllmServer], model: str = MODEL_NAME) -> list[Shard]:
    return [Shard(name=server.name, endpoint=server.url, model=model) for server in servers]


async def run_on(shards: list[Shard], prompts: list[str]) -> tuple[Any, ...]:
    """Run the prompts; returns the outcomes, the run's error, the run, the dispatcher and, per shard, the prompts
    that failed there."""
    failed_on: dict[str, set[str]] = {}
    async with GenerationClient(timeout_seconds=60) as client, Dispatcher(ControlledSource(shards), POLICY) as d:

        async def rollout(shard: Shard, prompt: str) -> str:
            extra = {"max_tokens": -5} if prompt == BAD_PARAMETER else None
            try:
                completion = await client.complete(shard, prompt, max_tokens=None if extra else 4, extra=extra)
            except Exception:
                failed_on.setdefault(shard.name, set()).add(prompt)
                raise
            return completion.text

        run = d.run(prompts, rollout)
        outcomes, error = await collect_until_error(run, seconds=240)
        return outcomes, error, run, d, failed_on


async def test_each_error_answer_gets_its_documented_first_verdict(vllm_shared: list[VllmServer]) -> None:
    shard = shards_of(vllm_shared)[0]
    wrong_model = Shard(name=shard.name, endpoint=shard.endpoint, model="not-served")
    seen: dict[str, tuple[int | None, FailureClass, str]] = {}
    async with GenerationClient(timeout_seconds=60) as client:
        for name, call in {
            "context overflow": client.complete(shard, TOO_LONG, max_tokens=4),
            "bad parameter": client.complete(shard, "the cat", max_tokens=None, extra={"max_tokens": -5}),
            "max_tokens over the context": client.complete(shard, "the cat", max_tokens=MAX_MODEL_LEN + 1),
            "unknown model": client.complete(wrong_model, "the cat", max_tokens=4),
        }.items():
            try:
                await call
            except RolloutDataFailure as failure:
                seen[name] = (failure.status, classify_rollout_failure(failure), str(failure))
    assert set(seen) == {"context overflow", "bad parameter", "max_tokens over the context", "unknown model"}
    assert all(verdict is FailureClass.DATA for _, verdict, _ in seen.values())
    assert seen["context overflow"][0] == 400
    assert "maximum context length" in seen["context overflow"][2], "vLLM's own words are the reason"
    assert seen["bad parameter"][0] == 400
    assert "max_tokens" in seen["bad parameter"][2]
    assert seen["max_tokens over the context"][0] == 400
    assert seen["unknown model"][0] == 404
    assert "does not exist" in seen["unknown model"][2]


async def test_overflow_and_a_poison_prompt_are_data_and_eject_no_shard(vllm_shared: list[VllmServer]) -> None:
    prompts = ["the cat", "a dog", TOO_LONG, "it is", BAD_PARAMETER, "you and", "he was", "in the"]
    outcomes, error, run, dispatcher, _ = await run_on(shards_of(vllm_shared), prompts)
    assert error is None, "a bad prompt ended the run"
    failed = {o.prompt_id: o for o in by_kind(outcomes)["data_failed"]}
    assert sorted(failed) == [2, 4]
    assert "maximum context length" in failed[2].reason
    assert "max_tokens" in failed[4].reason
    assert all(len(set(o.shards)) == 2 for o in failed.values()), "each confirmed on the second server"
    assert run.stats.ejections == 0
    assert dispatcher.ejected == frozenset()
    assert len(by_kind(outcomes)["completed"]) == 6
    assert_accounted(run, outcomes, range(len(prompts)))


async def test_a_shard_serving_another_model_is_the_sick_one_not_the_prompts(vllm_shared: list[VllmServer]) -> None:
    good, misnamed = shards_of(vllm_shared[:1])[0], shards_of(vllm_shared[1:], model="not-served")[0]
    prompts = [f"the cat {i}" for i in range(12)]
    outcomes, error, run, dispatcher, failed_on = await run_on([good, misnamed], prompts)
    assert error is None
    assert failed_on.get(misnamed.name), "the misnamed shard was tried and answered 404"
    assert good.name not in failed_on
    assert len(by_kind(outcomes)["completed"]) == 12, "every prompt completed on the shard that serves the model"
    assert by_kind(outcomes)["data_failed"] == [], "a 404 never convicts a prompt (docs/blame.md)"
    if len(failed_on[misnamed.name]) >= 2:  # the sick-shard rule: two distinct prompts' evidence
        assert misnamed.name in dispatcher.ejected
    assert_accounted(run, outcomes, range(len(prompts)))


async def test_the_router_in_front_of_real_vllm(vllm_shared: list[VllmServer]) -> None:
    shards = shards_of(vllm_shared)
    include_usage = {"stream_options": {"include_usage": True}}
    routed = await through_the_router(shards, MODEL_NAME, too_long=TOO_LONG, stream_extra=include_usage)
    assert routed.answered_by == {shard.name for shard in shards}
    assert routed.chunks[-1]["usage"]["completion_tokens"] == 4, "vLLM's usage chunk is relayed"
    assert routed.rejected_status == 400, routed.rejected  # vLLM's own 4xx, relayed as it came
    assert b"maximum context length" in routed.rejected
