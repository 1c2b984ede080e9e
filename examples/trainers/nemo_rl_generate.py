"""NeMo-RL-style batch generation across a fleet: prompts in, token ids and logprobs out.

    python examples/trainers/nemo_rl_generate.py --endpoint http://127.0.0.1:8001 --endpoint http://127.0.0.1:8002

generate_batch returns NeMo-RL's GenerationOutputSpec fields (output_ids, logprobs, generation_lengths) as lists,
one row per prompt x sample; a trainer wraps them in its own tensors.
"""

from __future__ import annotations

import argparse
import asyncio

from rollout_runtime.adapters import BatchGeneration, generate_batch
from rollout_runtime.dispatch import Dispatcher, DispatchPolicy
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import Shard, StaticShardSource


async def main(endpoints: list[str], model: str = "", count: int = 16, n: int = 2) -> BatchGeneration:
    shards = [Shard(name=f"shard-{i}", endpoint=url, model=model) for i, url in enumerate(endpoints)]
    prompts = [f"What is {i} + {i * 3}?" for i in range(count)]
    policy = DispatchPolicy(progress_watchdog=True, max_concurrency=64)
    async with GenerationClient() as client, Dispatcher(StaticShardSource(shards), policy) as dispatcher:
        await dispatcher.wait_ready(1, timeout=30)
        return await generate_batch(dispatcher, client, prompts, max_tokens=16, n=n)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", action="append", required=True)
    parser.add_argument("--model", default="")
    args = parser.parse_args()
    batch = asyncio.run(main(args.endpoint, args.model))
    for ids, logprobs, text in zip(batch.output_ids, batch.logprobs, batch.texts, strict=True):
        print(text, ids, [round(lp, 3) for lp in logprobs])
