"""A real llama.cpp server streams too: its SSE and its JSON parse into the same typed results as the sim shard's."""

from __future__ import annotations

import dataclasses

from rollout_runtime.dispatch import Completed, Dispatcher, DispatchPolicy
from rollout_runtime.generation import GenerationClient, GenerationOptions
from rollout_runtime.results import Choice, Completion
from rollout_runtime.shards import Shard, StaticShardSource
from support.deadlines import within
from support.llama import MODEL_ALIAS, StartLlamaServers

# llama-cpp-python is an OpenAI server, not vLLM: send only the OpenAI fields.
GREEDY = GenerationOptions(logprobs=1, dialect="openai")


async def test_llama_stream_and_body_parse_into_identical_results(llama_servers: StartLlamaServers) -> None:
    (server,) = llama_servers(1)
    shard = Shard(name="llama-0", endpoint=server.url, model=MODEL_ALIAS)
    async with GenerationClient(timeout_seconds=60) as client:
        whole = await within(client.complete(shard, "the cat", max_tokens=6, options=GREEDY), "a completion")
        streamed = await within(
            client.complete(shard, "the cat", max_tokens=6, options=dataclasses.replace(GREEDY, stream=True)),
            "a streamed completion",
        )
    for completion in (whole, streamed):
        assert isinstance(completion, Completion)
        assert all(isinstance(choice, Choice) for choice in completion.choices)
        assert completion.shard == "llama-0"
    assert streamed.text == whole.text, "greedy decoding: the same answer either way"
    assert streamed.finish_reason == whole.finish_reason
    assert len(streamed.choices) == len(whole.choices) == 1
    assert whole.logprobs is not None, "llama.cpp returns completion logprobs when asked"
    assert streamed.choices[0].tokens == whole.choices[0].tokens


async def test_a_dispatcher_streams_from_llama_under_the_progress_watchdog(llama_servers: StartLlamaServers) -> None:
    servers = llama_servers(2)
    shards = [Shard(name=s.name, endpoint=s.url, model=MODEL_ALIAS) for s in servers]
    policy = DispatchPolicy(progress_watchdog=True, progress_floor_seconds=5, max_concurrency=2)
    options = GenerationOptions(stream=True, dialect="openai")
    async with GenerationClient(timeout_seconds=60) as client, Dispatcher(StaticShardSource(shards), policy) as d:

        async def rollout(shard: Shard, prompt: str) -> Completion:
            return await client.complete(shard, prompt, max_tokens=4, options=options)

        outcomes = [o async for o in d.run(["a b", "the", "c d e", "it is"], rollout)]
    assert all(isinstance(o, Completed) for o in outcomes)
    assert all(isinstance(o.result, Completion) for o in outcomes if isinstance(o, Completed))
