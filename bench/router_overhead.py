"""What does ``rollout-fleet router`` add in front of healthy shards? Measured against nginx in the same run.

The same sim shards (real subprocesses, no injected latency, no chaos) behind three fronts: none (the client calls
the shards round-robin itself: the floor), nginx (bench/_peers.py's config), and the router (a subprocess, local
probing). The same client sends the same prompts through each at C concurrent requests, each prompt once. Reported
per front: p50/p99 latency, requests per second; then the router's added p50 over nginx (target <= 1 ms) and its
throughput as a share of nginx's (target >= 0.5x).

    python bench/router_overhead.py              # 4 shards, 64 concurrent, 6400 requests per front
    python bench/router_overhead.py --latency 0.2 --requests 3200   # shards that take 0.2 s per generation
    python bench/router_overhead.py --smoke      # tiny sizes (CI; no numbers asserted)

With no injected latency the shards answer as fast as they can and the closed loop saturates the machine's CPUs, so
every front's latency is queueing (p50 ~ concurrency / throughput) and the run measures the router's throughput
ceiling; ``--latency`` measures what it adds to a request when nothing saturates.

Needs nginx: ``bash scripts/install-tools.sh nginx``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from _peers import Nginx, ProxySettings
from rollout_runtime.router.process import spawn_router
from rollout_runtime.sim import SimFleet

MARKER = "router overhead vs nginx"


@dataclass(frozen=True)
class Result:
    front: str
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def drive(front: str, urls: Sequence[str], requests: int, concurrency: int) -> Result:
    """``requests`` completions, ``concurrency`` at a time, spread round-robin over ``urls``."""
    latencies: list[float] = []
    errors = 0
    targets = itertools.cycle(urls)
    counter = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def worker() -> None:
            nonlocal errors
            for index in counter:
                body = {"prompt": f"What is {index} + 1?", "max_tokens": 4}
                started = time.perf_counter()
                async with http.post(next(targets) + "/v1/completions", json=body) as response:
                    await response.read()
                    ok = response.status == 200
                latencies.append(time.perf_counter() - started)
                errors += not ok

        await asyncio.gather(*(worker() for _ in range(min(64, concurrency // 8 or 1))))  # warm connections
        latencies.clear()
        counter = iter(range(requests))
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return Result(
        front, _percentile(latencies, 0.5) * 1000, _percentile(latencies, 0.99) * 1000, requests / wall, errors
    )


async def main_async(shards: int, requests: int, concurrency: int, latency: float = 0.0) -> None:
    extra = ("--slow", str(latency)) if latency else ()
    async with SimFleet(shards, extra_args=extra) as fleet:
        urls = [shard.endpoint for shard in fleet.shards]
        ports = {shard.name: int(shard.endpoint.rsplit(":", 1)[1]) for shard in fleet.shards}
        results = [await drive("none (direct)", urls, requests, concurrency)]
        settings = ProxySettings(attempt_timeout=30, probe_period=1, probe_timeout=0.5, fall=3, rise=2, tries=3)
        async with Nginx(ports, settings) as nginx:
            results.append(await drive("nginx", [nginx.url], requests, concurrency))
        args = [a for shard in fleet.shards for a in ("--shard", f"{shard.name}={shard.endpoint}")]
        router = await spawn_router([*args, "--probe-period", "0.5", "--log-level", "WARNING"])
        async with router, aiohttp.ClientSession() as http:
            for _ in range(200):  # the router's probes find the shards (setup, not measured)
                async with http.get(router.url + "/readyz") as response:
                    if response.status == 200 and (await response.json())["routable"] == shards:
                        break
                await asyncio.sleep(0.05)
            results.append(await drive("router", [router.url], requests, concurrency))
    print(f"\n{'front':16} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>7}")
    for r in results:
        print(f"{r.front:16} {r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.rps:8.0f} {r.errors:7d}")
    nginx_row, router_row = results[1], results[2]
    print(
        f"\n{MARKER}: added p50 {router_row.p50_ms - nginx_row.p50_ms:+.2f} ms (target <= 1 ms), "
        f"throughput {router_row.rps / nginx_row.rps:.2f}x nginx's (target >= 0.5x), at {concurrency} concurrent"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs, not the numbers")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--requests", type=int, default=6400)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each shard takes per generation")
    options = parser.parse_args()
    if options.smoke:
        asyncio.run(main_async(2, 200, 16))
    else:
        asyncio.run(main_async(options.shards, options.requests, options.concurrency, options.latency))


if __name__ == "__main__":
    main()
