"""Shards that cap their concurrency and answer 429 with Retry-After beyond it: the router and the library, one run.

N sim shards (real subprocesses) each serve at most C generations at once, each taking T seconds; one more is
answered 429 with ``Retry-After: 1`` at once. R requests, K at a time (K well past N x C), go through two fronts in
turn: ``rollout-fleet router`` (a subprocess) and the library's dispatcher with its generation client in this
process; both learn each shard's room from its 429s and queue the rest (``dispatch/gate.py``, the router's requests
going through its dispatcher). The capacity bound is
R x T / (N x C): no front can finish sooner. A third front, "ideal", is the client itself keeping each shard at
exactly C (it knows the caps): the bound as this machine meets it in the same run. Reported per front: wall time and
its ratio to the bound, 429 answers per request (the shards' own counts), p50/p99 latency, errors. Targets for the
router and the library: within 10% of the bound and at most one 429 per 10 requests.

    python bench/backpressure.py             # 4 shards x 12, 0.1 s generations, 2,000 requests, 256 at a time
    python bench/backpressure.py --smoke     # tiny sizes (CI; no numbers asserted)
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client import CollectorRegistry

from rollout_runtime.dispatch import Completed, Dispatcher, DispatchPolicy
from rollout_runtime.generation import GenerationClient
from rollout_runtime.router.process import spawn_router
from rollout_runtime.shards import Shard, StaticShardSource
from rollout_runtime.sim import SimFleet

MARKER = "backpressure vs the capacity bound"


@dataclass(frozen=True)
class Result:
    front: str
    seconds: float
    busy: int
    latencies: list[float]
    errors: int


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def _busy_answers(fleet: SimFleet) -> int:
    return sum([(await fleet.stats(name)).get("errors_429", 0) for name in fleet.names])


async def _measure(
    front: str, fleet: SimFleet, requests: int, send: Callable[[int], Awaitable[bool]], k: int
) -> Result:
    """``requests`` calls of ``send``, ``k`` at a time; the shards' 429s during them."""
    before = await _busy_answers(fleet)
    latencies: list[float] = []
    errors = 0
    pending = iter(range(requests))

    async def worker() -> None:
        nonlocal errors
        for index in pending:
            started = time.perf_counter()
            ok = await send(index)
            latencies.append(time.perf_counter() - started)
            errors += not ok

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(k)))
    seconds = time.perf_counter() - started
    return Result(front, seconds, await _busy_answers(fleet) - before, latencies, errors)


async def through_router(fleet: SimFleet, requests: int, k: int) -> Result:
    args = [a for shard in fleet.shards for a in ("--shard", f"{shard.name}={shard.endpoint}")]
    extra = ["--probe-period", "0.5", "--log-level", "WARNING", "--max-concurrency", str(max(1024, 2 * k))]
    async with await spawn_router([*args, *extra]) as router:
        connector = aiohttp.TCPConnector(limit=k)
        async with aiohttp.ClientSession(connector=connector) as http:
            for _ in range(200):  # the router's probes find the shards (setup, not measured)
                async with http.get(router.url + "/readyz") as response:
                    if response.status == 200 and (await response.json())["routable"] == len(fleet.names):
                        break
                await asyncio.sleep(0.05)

            async def send(index: int) -> bool:
                body = {"prompt": f"What is {index} + 1?", "max_tokens": 4}
                async with http.post(router.url + "/v1/completions", json=body) as response:
                    await response.read()
                    return response.status == 200

            return await _measure("router", fleet, requests, send, k)


async def ideal(fleet: SimFleet, requests: int, k: int, cap: int) -> Result:
    """The client itself keeping every shard at exactly its cap (it knows it): the best this machine does."""
    slots = [(shard, asyncio.Semaphore(cap)) for shard in fleet.shards]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def send(index: int) -> bool:
            shard, slot = slots[index % len(slots)]  # each shard its share, at most ``cap`` at once
            async with slot:
                body = {"prompt": f"What is {index} + 1?", "max_tokens": 4}
                async with http.post(shard.endpoint + "/v1/completions", json=body) as response:
                    await response.read()
                    return response.status == 200

        return await _measure("ideal", fleet, requests, send, k)


async def through_library(fleet: SimFleet, requests: int, k: int) -> Result:
    policy = DispatchPolicy(max_concurrency=k, max_infra_attempts=100, backoff_initial_seconds=0.02)
    source = StaticShardSource(fleet.shards)
    async with (
        GenerationClient(max_connections=k) as client,
        Dispatcher(source, policy, registry=CollectorRegistry()) as dispatcher,
    ):
        await dispatcher.wait_ready(len(fleet.names), timeout=30)

        async def rollout(shard: Shard, prompt: int) -> str:
            return (await client.complete(shard, f"What is {prompt} + 1?", max_tokens=4)).text

        before = await _busy_answers(fleet)
        started = time.perf_counter()
        latencies: list[float] = []
        errors = 0
        sent = {index: started for index in range(requests)}
        async for outcome in dispatcher.run(list(range(requests)), rollout):
            # every prompt is submitted at the start: its latency is its time to completion, queueing included
            latencies.append(time.perf_counter() - sent[int(outcome.prompt_id)])
            errors += not isinstance(outcome, Completed)
        seconds = time.perf_counter() - started
        return Result("library", seconds, await _busy_answers(fleet) - before, latencies, errors)


async def main_async(shards: int, cap: int, latency: float, requests: int, k: int) -> None:
    bound = requests * latency / (shards * cap)
    async with SimFleet(shards, extra_args=("--slow", str(latency))) as fleet:
        for name in fleet.names:
            await fleet.set_faults(name, max_concurrent=cap, busy_retry_after_seconds=1)
        results = [
            await through_router(fleet, requests, k),
            await through_library(fleet, requests, k),
            await ideal(fleet, requests, k, cap),
        ]
    print(
        f"\n{shards} shards x {cap} at once, {latency:g} s per generation, {requests} requests {k} at a time; "
        f"capacity bound {bound:.2f} s"
    )
    print(
        f"{'front':10} {'seconds':>8} {'x bound':>8} {'429s':>6} {'429/req':>8} {'p50 s':>7} {'p99 s':>7} {'errors':>7}"
    )
    for r in results:
        print(
            f"{r.front:10} {r.seconds:8.2f} {r.seconds / bound:8.2f} {r.busy:6d} {r.busy / requests:8.3f} "
            f"{_percentile(r.latencies, 0.5):7.3f} {_percentile(r.latencies, 0.99):7.3f} {r.errors:7d}"
        )
    router = results[0]
    print(
        f"\n{MARKER}: router {router.seconds / bound:.2f}x the bound (target <= 1.10x), "
        f"{router.busy / requests:.3f} 429s per request (target <= 0.1); library {results[1].seconds / bound:.2f}x, "
        f"{results[1].busy / requests:.3f} per request; ideal {results[2].seconds / bound:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs, not the numbers")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--cap", type=int, default=12, help="generations each shard serves at once")
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per generation")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256, help="requests in flight at the client")
    options = parser.parse_args()
    if options.smoke:
        asyncio.run(main_async(2, 2, 0.05, 40, 16))
    else:
        asyncio.run(main_async(options.shards, options.cap, options.latency, options.requests, options.concurrency))


if __name__ == "__main__":
    main()
