"""GenerationClient against real servers: every failure lands in the taxonomy with the class the dispatcher needs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from rollout_runtime.failures import (
    FailureClass,
    GenerationUnavailable,
    RolloutDataFailure,
    RolloutTimeout,
    classify_rollout_failure,
)
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import Shard
from rollout_runtime.sim import SimShardConfig, create_app
from support.httpserver import refused_url, serve

MODEL = "sim-model"


@pytest.fixture
async def sim() -> AsyncIterator[Shard]:
    async with serve(create_app(SimShardConfig(model=MODEL, max_model_len=128))) as url:
        yield Shard(name="sim", endpoint=url, model=MODEL, max_model_len=128)


@pytest.fixture
async def client() -> AsyncIterator[GenerationClient]:
    async with GenerationClient(timeout_seconds=5) as client:
        yield client


async def set_faults(shard: Shard, **faults: object) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(shard.endpoint + "/admin/faults", json=faults) as response,
    ):
        assert response.status == 200


def raw_server(handler: object) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)  # type: ignore[arg-type]
    return app


async def test_completion_returns_text_and_usage(client: GenerationClient, sim: Shard) -> None:
    completion = await client.complete(sim, "What is 6 * 7?", max_tokens=4)
    assert (completion.text, completion.finish_reason, completion.shard) == ("42", "stop", "sim")
    assert (completion.prompt_tokens, completion.completion_tokens, completion.model) == (5, 1, MODEL)


async def test_chat_returns_the_message_content(client: GenerationClient, sim: Shard) -> None:
    completion = await client.chat(sim, [{"role": "user", "content": "reverse: x y"}])
    assert completion.text == "y x"


async def test_over_long_prompt_is_a_data_failure_carrying_vllms_message(client: GenerationClient, sim: Shard) -> None:
    with pytest.raises(RolloutDataFailure) as caught:
        await client.complete(sim, "w " * 130, max_tokens=4)
    assert caught.value.status == 400
    assert str(caught.value).startswith("This model's maximum context length is 128 tokens. However, you requested 134")
    assert classify_rollout_failure(caught.value) is FailureClass.DATA


@pytest.mark.parametrize("status", [503, 500, 429, 408, 425])
async def test_retriable_statuses_are_generation_unavailable(client: GenerationClient, sim: Shard, status: int) -> None:
    await set_faults(sim, fail_next=1, error_status=status)
    with pytest.raises(GenerationUnavailable) as caught:
        await client.complete(sim, "hi")
    assert caught.value.status == status
    assert classify_rollout_failure(caught.value) is FailureClass.INFRA
    assert (await client.complete(sim, "hi")).text == "hi"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 407, 413, 422])
async def test_other_client_errors_are_data_failures(client: GenerationClient, sim: Shard, status: int) -> None:
    await set_faults(sim, fail_next=1, error_status=status)
    with pytest.raises(RolloutDataFailure) as caught:
        await client.complete(sim, "hi")
    assert caught.value.status == status
    assert f"HTTP {status}" in str(caught.value)


@pytest.mark.parametrize("status", [401, 403, 404, 407])
async def test_an_answer_about_the_shard_or_the_fleet_names_the_shard(
    client: GenerationClient, sim: Shard, status: int
) -> None:
    """Data by its status, but never the prompt's: the message (the ledger's reason) says which shard gave it."""
    await set_faults(sim, fail_next=1, error_status=status)
    with pytest.raises(RolloutDataFailure) as caught:
        await client.complete(sim, "hi")
    assert f"shard {sim.name}" in str(caught.value)
    assert f"answered HTTP {status}" in str(caught.value)


async def test_a_shard_serving_another_model_says_so(client: GenerationClient, sim: Shard) -> None:
    """A 404 like any other 4xx by its first verdict, with words that name the cause (blame weighs whose it is)."""
    await set_faults(sim, wrong_model="llama-3")
    with pytest.raises(RolloutDataFailure, match="does not serve the model") as caught:
        await client.complete(sim, "hi")
    assert caught.value.status == 404


async def test_connection_refused_is_generation_unavailable(client: GenerationClient) -> None:
    with pytest.raises(GenerationUnavailable, match="dead"):
        await client.complete(Shard(name="dead", endpoint=refused_url()), "hi")


async def test_hung_shard_is_a_rollout_timeout() -> None:
    never = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        await never.wait()
        return web.Response()

    async with serve(raw_server(hang)) as url, GenerationClient(timeout_seconds=0.3) as client:
        with pytest.raises(RolloutTimeout, match=r"did not answer within 0\.3 s"):
            await client.complete(Shard(name="hung", endpoint=url), "hi")


async def test_response_cut_off_mid_body_is_generation_unavailable(client: GenerationClient, sim: Shard) -> None:
    await set_faults(sim, drop_next=1)
    with pytest.raises(GenerationUnavailable) as caught:
        await client.complete(sim, "hi")
    assert classify_rollout_failure(caught.value) is FailureClass.INFRA


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"<html><body>Sign in to continue</body></html>",
        b"{}",
        b'{"choices": []}',
        b'{"choices": [{"text": 5}]}',
        b'{"choices": [null]}',
        b'{"error": {"message": "internal error", "type": "server_error"}}',
    ],
)
async def test_malformed_success_body_is_the_shards_failure(client: GenerationClient, body: bytes) -> None:
    """A 200 that is not a completion is infra (status 200): blame re-reads it as the prompt's only on evidence."""

    async def malformed(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    async with serve(raw_server(malformed)) as url:
        with pytest.raises(GenerationUnavailable, match="not a completion") as caught:
            await client.complete(Shard(name="odd", endpoint=url), "hi")
    assert caught.value.status == 200


async def test_oversized_response_is_generation_unavailable() -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"x" * 4096)

    async with serve(raw_server(huge)) as url, GenerationClient(max_response_bytes=1024) as client:
        with pytest.raises(GenerationUnavailable, match="larger than 1024 bytes"):
            await client.complete(Shard(name="big", endpoint=url), "hi")


async def test_long_server_messages_are_bounded(client: GenerationClient) -> None:
    async def verbose(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "error", "message": "x" * 50_000, "code": 400}, status=400)

    async with serve(raw_server(verbose)) as url:
        with pytest.raises(RolloutDataFailure) as caught:
            await client.complete(Shard(name="verbose", endpoint=url), "hi")
    assert len(str(caught.value)) == 2000


async def test_openai_style_nested_error_messages_are_read(client: GenerationClient) -> None:
    async def nested(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "bad prompt", "type": "invalid_request_error"}}, status=422)

    async with serve(raw_server(nested)) as url:
        with pytest.raises(RolloutDataFailure, match=r"^bad prompt$"):
            await client.complete(Shard(name="oai", endpoint=url), "hi")
