"""One walk through the router in front of real servers (llama.cpp, vLLM): completions spread over every shard, a
stream relayed to its ``data: [DONE]``, an over-long prompt's 4xx relayed as it came. Each test then asserts what is
particular to its server."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from rollout_runtime.router import SHARD_HEADER, Router, serve_router
from rollout_runtime.shards import Shard, StaticShardSource
from support.deadlines import within


@dataclass
class Routed:
    answered_by: set[str]
    """The shards that answered the completions (the router's shard header)."""
    chunks: list[dict[str, Any]]
    """The relayed stream's chunks, ``data: [DONE]`` checked and removed."""
    rejected_status: int
    rejected: bytes
    """The over-long prompt's answer, as relayed."""


async def through_the_router(
    shards: Sequence[Shard], model: str, *, too_long: str, stream_extra: Mapping[str, Any] | None = None
) -> Routed:
    """Six completions, one stream and one over-long prompt through a router in front of ``shards``."""
    async with (
        Router(StaticShardSource(list(shards))) as router,
        serve_router(router) as front,
        aiohttp.ClientSession() as http,
    ):
        await within(router.dispatcher.wait_ready(len(shards)), f"{len(shards)} shards routable")
        answered_by: set[str] = set()
        for index in range(6):
            body = {"model": model, "prompt": f"the cat {index}", "max_tokens": 4}
            async with http.post(front.url + "/v1/completions", json=body) as response:
                text = await within(response.text(), f"completion {index}")
                assert response.status == 200, text
                answered_by.add(response.headers[SHARD_HEADER])
            assert json.loads(text)["object"] == "text_completion"

        stream = {"model": model, "prompt": "a b", "max_tokens": 4, "stream": True, **(stream_extra or {})}
        async with http.post(front.url + "/v1/completions", json=stream) as response:
            assert response.status == 200
            assert response.content_type == "text/event-stream"
            events = await within(response.text(), "the stream")
        lines = [line for line in events.splitlines() if line.strip()]
        assert lines[-1] == "data: [DONE]", events
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]

        over_long = {"model": model, "prompt": too_long, "max_tokens": 4}
        async with http.post(front.url + "/v1/completions", json=over_long) as response:
            rejected = await within(response.read(), "the over-long prompt's answer")
            status = response.status
    return Routed(answered_by, chunks, status, rejected)
