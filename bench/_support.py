"""What the dispatch benchmarks share: the zero-latency rollouts, the bare asyncio loop they are measured against,
and the timer. Imported as a sibling module (``python bench/<script>.py`` puts bench/ first on the path).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from rollout_runtime.shards import Shard

SHARDS = [Shard(name=f"shard-{i}", endpoint=f"http://127.0.0.1:{8000 + i}") for i in range(4)]


Rollout = Callable[[Shard, int], Awaitable[int]]


async def returns_at_once(shard: Shard, prompt: int) -> int:
    return prompt


async def yields_once(shard: Shard, prompt: int) -> int:
    await asyncio.sleep(0)  # one trip through the event loop, as any real I/O makes
    return prompt


async def bare_semaphore_loop(prompts: list[int], concurrency: int, rollout: Rollout) -> int:
    semaphore = asyncio.Semaphore(concurrency)
    shard = SHARDS[0]

    async def one(prompt: int) -> int:
        async with semaphore:
            return await rollout(shard, prompt)

    results = await asyncio.gather(*(one(p) for p in prompts))
    return len(results)


Runner = Callable[[list[int], int, Rollout], Coroutine[Any, Any, int]]


def timed(runner: Runner, prompts: list[int], concurrency: int, rollout: Rollout) -> float:
    """Seconds for one run on a fresh event loop (GC off while timing, as timeit does)."""
    loop = asyncio.new_event_loop()
    try:
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        done = loop.run_until_complete(runner(prompts, concurrency, rollout))
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
        loop.close()
    assert done == len(prompts), f"{runner.__name__} finished {done} of {len(prompts)}"
    return elapsed
