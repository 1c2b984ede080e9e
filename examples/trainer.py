"""Trainer side: follow the `demo` RolloutFleet's healthy set and roll out a batch across it.

    python examples/trainer.py --namespace default --fleet demo

The dispatcher takes its policy from the fleet's spec.policy, routes each prompt to a healthy shard, redispatches
infrastructure failures elsewhere and reports data failures; the operator's probes keep the set current.
"""

from __future__ import annotations

import argparse
import asyncio

from rollout_runtime.dispatch import Completed, DataFailed, Dispatcher
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import KubernetesShardSource, Shard


async def main(namespace: str, fleet: str, count: int) -> None:
    source = KubernetesShardSource(fleet, namespace)
    policy = await source.dispatch_policy()
    async with GenerationClient(timeout_seconds=policy.attempt_timeout_seconds or 300) as client:

        async def rollout(shard: Shard, prompt: str) -> str:
            completion = await client.complete(shard, prompt, max_tokens=64)
            return completion.text

        prompts = [f"What is {i} + {i * 3}?" for i in range(count)]
        async with Dispatcher(source, policy) as dispatcher:
            async for outcome in dispatcher.run(prompts, rollout):
                if isinstance(outcome, Completed):
                    print(f"{outcome.prompt!r} -> {outcome.result.strip()!r} on {outcome.shard}")
                elif isinstance(outcome, DataFailed):
                    print(f"{outcome.prompt!r} data-failed: {outcome.reason}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--fleet", default="demo")
    parser.add_argument("--count", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(main(args.namespace, args.fleet, args.count))
