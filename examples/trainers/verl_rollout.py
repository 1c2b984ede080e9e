"""A verl server-rollout recipe: the agent loop's server manager calls generate(prompt_ids, sampling_params,
request_id); FleetGenerateServer answers it from the fleet instead of from co-located vLLM servers.

    python examples/trainers/verl_rollout.py --endpoint http://127.0.0.1:8001 --endpoint http://127.0.0.1:8002

In verl, construct one FleetGenerateServer per trainer process and hand it where the agent loop expects its
``server_manager`` (anything with ``async generate(prompt_ids, sampling_params, request_id)``); tokenise with the
policy's own tokenizer, as verl does, and read token ids and logprobs back without re-tokenising.
"""

from __future__ import annotations

import argparse
import asyncio

from rollout_runtime.adapters import FleetGenerateServer, TokenOutput
from rollout_runtime.dispatch import Dispatcher, DispatchPolicy
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import Shard, StaticShardSource


async def agent_loop(server: FleetGenerateServer, prompt_ids: list[int], turns: int) -> list[TokenOutput]:
    """A minimal multi-turn loop: each turn appends the answer's tokens to the context."""
    outputs: list[TokenOutput] = []
    context = list(prompt_ids)
    for turn in range(turns):
        output = await server.generate(context, {"max_tokens": 8, "temperature": 1.0}, request_id=f"req-{turn}")
        outputs.append(output)
        context += output.token_ids
    return outputs


async def main(endpoints: list[str], model: str = "", turns: int = 3) -> list[TokenOutput]:
    shards = [Shard(name=f"shard-{i}", endpoint=url, model=model) for i, url in enumerate(endpoints)]
    policy = DispatchPolicy(progress_watchdog=True, max_concurrency=64)
    async with GenerationClient() as client, Dispatcher(StaticShardSource(shards), policy) as dispatcher:
        server = FleetGenerateServer(dispatcher, client)
        try:
            await server.session.wait_ready(1, timeout=30)
            return await agent_loop(server, [101, 2054, 2003], turns)
        finally:
            await server.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", action="append", required=True)
    parser.add_argument("--model", default="")
    args = parser.parse_args()
    for output in asyncio.run(main(args.endpoint, args.model)):
        print(output)
