"""Blame against a real OpenAI-compatible server this project did not write: llama.cpp's (llama-cpp-python).

Real processes on 127.0.0.1 with a tiny random-weight model (tests/support/llama.py): a context overflow is DATA; a
malformed request llama.cpp answers with 500 is a poison prompt that ejects no healthy shard and ends no run; a
SIGKILLed or SIGSTOPped server's prompts are redispatched with nothing lost.
"""

from __future__ import annotations

from typing import Any

from rollout_runtime.dispatch import Completed, Dispatcher, DispatchPolicy
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import Shard
from support.dispatch import ControlledSource, assert_accounted, by_kind, collect_until_error
from support.llama import CONTEXT_TOKENS, MODEL_ALIAS, LlamaServer, StartLlamaServers

POLICY = DispatchPolicy(
    backoff_initial_seconds=0.05,
    backoff_max_seconds=0.2,
    ejection_base_seconds=60,
    max_concurrency=2,
    max_skipped_prompts=1,  # the one bad prompt of a run is reported DataFailed and the run goes on
    min_step_batch_fraction=0.8,
)
TOO_LONG = " the" * (CONTEXT_TOKENS * 2)
MALFORMED = "a request llama.cpp cannot validate"


def shards_of(servers: list[LlamaServer]) -> list[Shard]:
    return [Shard(name=server.name, endpoint=server.url, model=MODEL_ALIAS) for server in servers]


async def run_on(
    servers: list[LlamaServer], prompts: list[str], policy: DispatchPolicy = POLICY, before: Any = None
) -> tuple[Any, ...]:
    async with (
        GenerationClient(timeout_seconds=60) as client,
        Dispatcher(ControlledSource(shards_of(servers)), policy) as d,
    ):

        async def rollout(shard: Shard, prompt: str) -> str:
            if before is not None:
                before(shard, prompt)
            extra = {"max_tokens": -5} if prompt == MALFORMED else None
            completion = await client.complete(shard, prompt, max_tokens=None if extra else 4, extra=extra)
            return completion.text

        run = d.run(prompts, rollout)
        outcomes, error = await collect_until_error(run, seconds=240)
        return outcomes, error, run, d


async def test_context_overflow_is_data_and_ejects_nothing(llama_servers: StartLlamaServers) -> None:
    servers = llama_servers(2)
    prompts = ["the cat", "a dog", TOO_LONG, "it is", "you and", "he was"]
    outcomes, error, run, _ = await run_on(servers, prompts)
    assert error is None
    failed = by_kind(outcomes)["data_failed"]
    assert [o.prompt_id for o in failed] == [2]
    assert "context" in failed[0].reason.lower(), "llama.cpp's own words are the reason"
    assert len(set(failed[0].shards)) == 2, "confirmed on the second server"
    assert run.stats.ejections == 0
    assert len(by_kind(outcomes)["completed"]) == 5
    assert_accounted(run, outcomes, range(len(prompts)))


async def test_a_malformed_request_answered_500_is_a_poison_prompt_not_a_sick_fleet(
    llama_servers: StartLlamaServers,
) -> None:
    servers = llama_servers(2)
    prompts = ["the cat", "a dog", "it is", "you and", MALFORMED, "he was", "in the", "to a"]
    outcomes, error, run, dispatcher = await run_on(servers, prompts)
    assert error is None, "a poison prompt ended the run"
    failed = by_kind(outcomes)["data_failed"]
    assert [o.prompt_id for o in failed] == [4]
    assert "poison prompt" in failed[0].reason
    assert "max_tokens" in failed[0].reason, "llama.cpp's 500 body names the bad field"
    assert run.stats.infra_failures >= 1, "the 500s were really answered (first verdict infra)"
    assert run.stats.ejections == 0
    assert dispatcher.ejected == frozenset()
    assert len(by_kind(outcomes)["completed"]) == 7
    assert_accounted(run, outcomes, range(len(prompts)))


async def test_a_sigkilled_server_is_redispatched_with_nothing_lost(llama_servers: StartLlamaServers) -> None:
    servers = llama_servers(2)
    victim = servers[0]
    killed: list[str] = []

    def kill_on_first_use(shard: Shard, prompt: str) -> None:
        if shard.name == victim.name and not killed:
            victim.process.kill()
            killed.append(prompt)

    prompts = [f"the cat {i}" for i in range(8)]
    outcomes, error, run, dispatcher = await run_on(servers, prompts, before=kill_on_first_use)
    assert killed, "the server was never killed"
    assert victim.process.returncode is not None
    assert error is None
    assert len(by_kind(outcomes)["completed"]) == 8
    assert run.stats.infra_failures >= 1
    assert victim.name in dispatcher.ejected
    assert all(isinstance(o, Completed) for o in outcomes)
    assert_accounted(run, outcomes, range(8))


async def test_a_sigstopped_server_is_redispatched_after_the_attempt_timeout(llama_servers: StartLlamaServers) -> None:
    servers = llama_servers(2)
    victim = servers[0]
    stopped: list[str] = []

    def stop_on_first_use(shard: Shard, prompt: str) -> None:
        if shard.name == victim.name and not stopped:
            victim.process.hang()
            stopped.append(prompt)

    policy = POLICY.model_copy(update={"attempt_timeout_seconds": 3.0})
    prompts = [f"a dog {i}" for i in range(8)]
    try:
        outcomes, error, run, dispatcher = await run_on(servers, prompts, policy, before=stop_on_first_use)
    finally:
        victim.process.resume()
    assert stopped, "the server was never stopped"
    assert error is None
    assert len(by_kind(outcomes)["completed"]) == 8
    assert run.stats.infra_failures >= 1, "the hung attempt timed out and was charged as infra"
    assert victim.name in dispatcher.ejected
    assert_accounted(run, outcomes, range(8))
