"""The real llama.cpp server the blame and streaming tests run against: what it really answers.

These pin the facts other tests build on (a completion, a stream ending in ``data: [DONE]``, the status of a context
overflow and of a malformed request), so a llama-cpp-python upgrade that changes them fails here, by name, first.
"""

from __future__ import annotations

import json

import aiohttp

from support.deadlines import within
from support.llama import CONTEXT_TOKENS, MODEL_ALIAS, StartLlamaServers


async def _post(url: str, payload: object) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/completions", json=payload) as response:
        return response.status, await response.read()


async def test_a_completion_comes_back_with_text_and_usage(llama_servers: StartLlamaServers) -> None:
    (server,) = llama_servers(1)
    status, body = await within(
        _post(server.url, {"model": MODEL_ALIAS, "prompt": "the cat", "max_tokens": 4}), "a completion"
    )
    assert status == 200, body
    payload = json.loads(body)
    assert payload["object"] == "text_completion"
    assert isinstance(payload["choices"][0]["text"], str)
    assert payload["usage"]["completion_tokens"] <= 4


async def test_a_stream_is_server_sent_events_ending_in_done(llama_servers: StartLlamaServers) -> None:
    (server,) = llama_servers(1)
    payload = {"model": MODEL_ALIAS, "prompt": "a b", "max_tokens": 4, "stream": True}

    async def read_events() -> list[str]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{server.url}/v1/completions", json=payload) as response,
        ):
            assert response.status == 200
            assert response.content_type == "text/event-stream"
            return [line.decode().strip() async for line in response.content if line.strip()]

    events = await within(read_events(), "a streamed completion")
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    assert chunks
    assert all("choices" in chunk for chunk in chunks)


async def test_a_prompt_longer_than_the_context_is_a_client_error(llama_servers: StartLlamaServers) -> None:
    (server,) = llama_servers(1)
    prompt = " the" * (CONTEXT_TOKENS * 2)
    status, body = await within(
        _post(server.url, {"model": MODEL_ALIAS, "prompt": prompt, "max_tokens": 4}), "an over-long prompt's answer"
    )
    assert status == 400, body
    assert b"context" in body.lower()


async def test_a_malformed_request_is_answered_500_not_4xx(llama_servers: StartLlamaServers) -> None:
    """llama-cpp-python reports its own request validation as a server error: the status alone reads "sick
    shard", which is why blame has to look at evidence across shards (a poison prompt fails the same everywhere)."""
    (server,) = llama_servers(1)
    status, body = await within(
        _post(server.url, {"model": MODEL_ALIAS, "prompt": "a", "max_tokens": -5}), "a malformed request's answer"
    )
    assert status == 500, body
    assert b"max_tokens" in body
