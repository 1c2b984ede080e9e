"""The router in front of real llama.cpp servers (llama-cpp-python's OpenAI-compatible server, uvicorn underneath):
what the router relays from a server this project did not write."""

from __future__ import annotations

import json

import aiohttp

from rollout_runtime.router import SHARD_HEADER, Router, serve_router
from rollout_runtime.shards import StaticShardSource
from rollout_runtime.shards.model import Shard
from support.deadlines import within
from support.llama import CONTEXT_TOKENS, MODEL_ALIAS, StartLlamaServers


async def test_completions_streams_and_a_rejected_prompt_through_the_router(
    llama_servers: StartLlamaServers,
) -> None:
    servers = llama_servers(2)
    shards = [Shard(name=server.name, endpoint=server.url) for server in servers]
    async with (
        Router(StaticShardSource(shards)) as router,  # llama-cpp-python's server has no /health to probe
        serve_router(router) as front,
        aiohttp.ClientSession() as http,
    ):
        await within(router.dispatcher.wait_ready(2), "both llama.cpp servers routable")
        answered_by: set[str] = set()
        for index in range(6):
            body = {"model": MODEL_ALIAS, "prompt": f"the cat {index}", "max_tokens": 4}
            async with http.post(front.url + "/v1/completions", json=body) as response:
                text = await within(response.text(), f"completion {index}")
                assert response.status == 200, text
                answered_by.add(response.headers[SHARD_HEADER])
            assert json.loads(text)["object"] == "text_completion"

        stream = {"model": MODEL_ALIAS, "prompt": "a b", "max_tokens": 4, "stream": True}
        async with http.post(front.url + "/v1/completions", json=stream) as response:
            assert response.status == 200
            assert response.content_type == "text/event-stream"
            events = await within(response.text(), "the stream")
        lines = [line for line in events.splitlines() if line.strip()]
        assert lines[-1] == "data: [DONE]", events
        assert all("choices" in json.loads(line.removeprefix("data: ")) for line in lines[:-1])

        too_long = {"model": MODEL_ALIAS, "prompt": " the" * (CONTEXT_TOKENS * 2), "max_tokens": 4}
        async with http.post(front.url + "/v1/completions", json=too_long) as response:
            rejected = await within(response.read(), "the over-long prompt's answer")
            assert response.status == 400, rejected  # llama.cpp's own 4xx, relayed as it came, not retried
        assert b"context" in rejected.lower()
    assert answered_by == {shard.name for shard in shards}
