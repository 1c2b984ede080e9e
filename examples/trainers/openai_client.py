"""Code written for the OpenAI SDK, rolled out across a fleet: DispatchedOpenAI is the AsyncOpenAI-shaped client.

    python examples/trainers/openai_client.py --endpoint http://127.0.0.1:8001 --endpoint http://127.0.0.1:8002

Every call is retried elsewhere on infra failures, watched for progress (streamed to the shard) and accounted once;
the response has the SDK's attributes plus token_ids per choice and the shard that answered.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from rollout_runtime.adapters import DispatchedOpenAI
from rollout_runtime.dispatch import Dispatcher, DispatchPolicy
from rollout_runtime.shards import Shard, StaticShardSource


async def sample_group(client: Any, question: str, n: int) -> list[tuple[str, list[int], list[float]]]:
    """What a GRPO loop asks for: n samples with their token ids and logprobs (plain OpenAI SDK calls)."""
    response = await client.completions.create(model="any", prompt=question, max_tokens=16, n=n, logprobs=0)
    return [(c.text, c.token_ids, c.logprobs.token_logprobs) for c in response.choices]


async def main(endpoints: list[str], model: str = "") -> dict[str, Any]:
    shards = [Shard(name=f"shard-{i}", endpoint=url, model=model) for i, url in enumerate(endpoints)]
    policy = DispatchPolicy(progress_watchdog=True, max_concurrency=64)
    async with Dispatcher(StaticShardSource(shards), policy) as dispatcher, DispatchedOpenAI(dispatcher) as client:
        await client.session.wait_ready(min_shards=1, timeout=30)
        group = await sample_group(client, "What is 6 * 7?", n=4)
        chat = await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "reverse: a b c"}], logprobs=True, top_logprobs=1
        )
        return {
            "group": group,
            "chat": chat.choices[0].message.content,
            "chat_tokens": [t.token for t in chat.choices[0].logprobs.content],
            "shard": chat.shard,
            "stats": client.session.stats,
        }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", action="append", required=True)
    parser.add_argument("--model", default="")
    args = parser.parse_args()
    print(asyncio.run(main(args.endpoint, args.model)))
