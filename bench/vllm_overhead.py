"""What do the dispatcher and the router add over calling a real vLLM server directly?

Real vLLM (the CPU build, ``bash scripts/install-tools.sh vllm``) serving the tiny model of
``rollout_runtime.vllm.tiny_model``, one or more servers started here (or ``--url`` for ones already running).
Three paths send the same completions, one request at a time so nothing queues, in interleaved rounds (every other
round in reverse order, so drift of the machine cancels): direct (aiohttp POST to the server), the library (the
``Dispatcher`` with ``GenerationClient``, a static shard set) and the router (``rollout-fleet router``'s app,
served in this process, the same aiohttp client in front). Reported: p50/p99 per path (medians over rounds) and the
added p50 of the library and the router over direct.

    python bench/vllm_overhead.py                      # 1 server, 5 rounds of 200 requests of 16 tokens
    python bench/vllm_overhead.py --url http://127.0.0.1:8000 --rounds 3
    python bench/vllm_overhead.py --smoke              # tiny sizes (no numbers asserted)

A vLLM server here takes 23-68 s to start on an idle 2-core machine (minutes on a busy one).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from statistics import median, quantiles

import aiohttp

from _peers import vllm_tool
from rollout_runtime.dispatch import Dispatcher, DispatchPolicy
from rollout_runtime.generation import GenerationClient
from rollout_runtime.router import Router, serve_router
from rollout_runtime.shards import Shard, StaticShardSource
from rollout_runtime.vllm import MODEL_NAME, VllmServer


def percentile(samples: list[float], q: int) -> float:
    return quantiles(samples, n=100, method="inclusive")[q - 1] if len(samples) > 1 else samples[0]


async def timed(requests: int, one: Callable[[int], Awaitable[None]]) -> list[float]:
    latencies = []
    for index in range(requests):
        start = time.perf_counter()
        await one(index)
        latencies.append(time.perf_counter() - start)
    return latencies


async def measure(urls: list[str], rounds: int, requests: int, tokens: int) -> None:
    shards = [Shard(name=f"vllm-{i}", endpoint=url, model=MODEL_NAME) for i, url in enumerate(urls)]
    body = {"model": MODEL_NAME, "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
    policy = DispatchPolicy(max_concurrency=1)
    async with (
        aiohttp.ClientSession() as http,
        GenerationClient() as client,
        Dispatcher(StaticShardSource(shards), policy) as dispatcher,
        Router(StaticShardSource(shards)) as router,
        serve_router(router) as front,
    ):
        await dispatcher.wait_ready(len(shards))
        await router.dispatcher.wait_ready(len(shards))

        async def post(url: str, index: int) -> None:
            async with http.post(f"{url}/v1/completions", json={**body, "prompt": f"the cat {index}"}) as answer:
                assert answer.status == 200, await answer.text()
                await answer.read()

        async def direct(index: int) -> None:
            await post(urls[index % len(urls)], index)

        async def rollout(shard: Shard, prompt: str) -> str:
            return (await client.complete(shard, prompt, max_tokens=tokens, extra={"ignore_eos": True})).text

        async def library_round(requests: int) -> list[float]:
            """One run of ``requests`` prompts at concurrency 1: each outcome's latency is the time since the
            previous one was delivered (the dispatcher's own work between prompts included)."""
            latencies, last = [], time.perf_counter()
            async for _ in dispatcher.run([f"the cat {index}" for index in range(requests)], rollout):
                now = time.perf_counter()
                latencies.append(now - last)
                last = now
            return latencies

        async def routed(index: int) -> None:
            await post(front.url, index)

        paths: dict[str, Callable[[int], Awaitable[list[float]]]] = {
            "direct": lambda n: timed(n, direct),
            "library": library_round,
            "router": lambda n: timed(n, routed),
        }
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        await timed(10, direct)  # warm the server and the connection pools
        for round_ in range(rounds):
            order = list(paths) if round_ % 2 == 0 else list(reversed(paths))
            for name in order:
                samples = await paths[name](requests)
                results[name].append((percentile(samples, 50), percentile(samples, 99)))
    p50 = {name: median(r[0] for r in rows) * 1e3 for name, rows in results.items()}
    p99 = {name: median(r[1] for r in rows) * 1e3 for name, rows in results.items()}
    print(f"{len(urls)} vLLM server(s), {rounds} rounds x {requests} sequential requests of {tokens} tokens")
    for name in paths:
        print(f"  {name:8s} p50 {p50[name]:8.2f} ms   p99 {p99[name]:8.2f} ms")
    print(f"  library adds {p50['library'] - p50['direct']:+.2f} ms at p50 over direct")
    print(f"  router  adds {p50['router'] - p50['direct']:+.2f} ms at p50 over direct")


async def main_async(args: argparse.Namespace) -> None:
    if args.url:
        await measure(args.url, args.rounds, args.requests, args.tokens)
        return
    tool = vllm_tool()
    python, model = tool.python, tool.tiny_model().v1
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as logs:
        servers = [VllmServer(f"vllm-{i}", python, model, Path(logs) / f"vllm-{i}.log") for i in range(args.servers)]
        try:
            for server in servers:
                server.start()
            started = time.monotonic()
            await asyncio.gather(*(server.wait_ready(600) for server in servers))
            rss = sum(server.rss_bytes() for server in servers) / 2**30
            print(f"started {len(servers)} server(s) in {time.monotonic() - started:.0f} s, {rss:.1f} GiB RSS")
            await measure([server.url for server in servers], args.rounds, args.requests, args.tokens)
        finally:
            await asyncio.gather(*(server.stop() for server in servers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--url", action="append", help="a running vLLM server serving tiny-llama (repeatable)")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (no numbers asserted)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.requests, args.tokens = 1, 5, 2
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
