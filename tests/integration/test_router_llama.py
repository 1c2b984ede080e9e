"""The router in front of real llama.cpp servers (llama-cpp-python's OpenAI-compatible server, uvicorn underneath):
what the router relays from a server this project did not write."""

from __future__ import annotations

from rollout_runtime.shards.model import Shard
from support.llama import CONTEXT_TOKENS, MODEL_ALIAS, StartLlamaServers
from support.routing import through_the_router


async def test_completions_streams_and_a_rejected_prompt_through_the_router(
    llama_servers: StartLlamaServers,
) -> None:
    servers = llama_servers(2)
    shards = [Shard(name=server.name, endpoint=server.url) for server in servers]  # no /health to probe
    routed = await through_the_router(shards, MODEL_ALIAS, too_long=" the" * (CONTEXT_TOKENS * 2))
    assert routed.answered_by == {shard.name for shard in shards}
    assert all("choices" in chunk for chunk in routed.chunks)
    assert routed.rejected_status == 400, routed.rejected  # llama.cpp's own 4xx, relayed as it came, not retried
    assert b"context" in routed.rejected.lower()
