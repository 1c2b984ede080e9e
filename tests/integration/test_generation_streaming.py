"""Typed results and SSE streaming against a real sim shard that answers as vLLM does."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import aiohttp
import pytest

from rollout_runtime.failures import FailureClass, GenerationUnavailable, classify_rollout_failure
from rollout_runtime.generation import GenerationClient, GenerationOptions
from rollout_runtime.shards import Shard
from rollout_runtime.sim import SimShardConfig, create_app
from rollout_runtime.sim.tokens import token_id, token_logprob
from support.httpserver import serve

MODEL = "sim-model"
RICH = GenerationOptions(n=3, logprobs=1, prompt_logprobs=0, token_ids=True)


@pytest.fixture
async def sim() -> AsyncIterator[Shard]:
    async with serve(create_app(SimShardConfig(model=MODEL))) as url:
        yield Shard(name="sim", endpoint=url, model=MODEL)


@pytest.fixture
async def client() -> AsyncIterator[GenerationClient]:
    async with GenerationClient(timeout_seconds=5) as client:
        yield client


async def set_faults(shard: Shard, **faults: object) -> None:
    async with aiohttp.ClientSession() as http, http.post(shard.endpoint + "/admin/faults", json=faults) as response:
        assert response.status == 200


async def stats(shard: Shard) -> dict[str, int]:
    async with aiohttp.ClientSession() as http, http.get(shard.endpoint + "/admin/stats") as response:
        return dict(await response.json())


def without_raw(completion: object) -> object:
    return dataclasses.replace(completion, raw={})  # type: ignore[type-var]


async def test_completion_has_token_ids_logprobs_and_all_choices(client: GenerationClient, sim: Shard) -> None:
    completion = await client.complete(sim, "echo one two three", max_tokens=8, options=RICH)
    words = ["echo", "one", "two", "three"]
    assert len(completion.choices) == 3
    assert completion.token_ids == tuple(token_id(w) for w in words)
    assert completion.logprobs == tuple(token_logprob(w) for w in words)
    assert completion.prompt_logprobs is not None
    assert completion.prompt_logprobs[0] is None
    assert completion.usage.completion_tokens == 3 * len(words)
    assert (completion.shard, completion.weights_version) == ("sim", None)


@pytest.mark.parametrize("chat", [False, True])
async def test_streamed_and_whole_answers_are_the_same_result(client: GenerationClient, sim: Shard, chat: bool) -> None:
    options = dataclasses.replace(RICH, prompt_logprobs=None)
    streamed_options = dataclasses.replace(options, stream=True)
    if chat:
        messages = [{"role": "user", "content": "reverse: a b c d"}]
        whole = await client.chat(sim, messages, options=options)
        streamed = await client.chat(sim, messages, options=streamed_options)
    else:
        whole = await client.complete(sim, "reverse: a b c d", options=options)
        streamed = await client.complete(sim, "reverse: a b c d", options=streamed_options)
    assert (await stats(sim))["streams"] == 1  # the second request really streamed
    assert whole.text == "d c b a"
    assert streamed.choices == whole.choices
    assert streamed.usage == whole.usage


async def test_a_stream_cut_midway_is_infra(client: GenerationClient, sim: Shard) -> None:
    await set_faults(sim, drop_next=1)
    with pytest.raises(GenerationUnavailable) as caught:
        await client.complete(sim, "echo a b c d e f", options=GenerationOptions(stream=True))
    assert classify_rollout_failure(caught.value) is FailureClass.INFRA
    assert (await stats(sim))["dropped"] == 1
