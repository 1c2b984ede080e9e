"""What does ``rollout-fleet router`` add in front of healthy shards? Measured against nginx in the same run.

The same sim shards (real subprocesses, no injected latency, no chaos) behind four fronts: none (the client calls
the shards round-robin itself), nginx (bench/_peers.py's config), the least an aiohttp proxy can do
(bench/_aiohttp_floor.py: the HTTP stack the router is built on, without its dispatcher) and the router (a
subprocess, local probing). The same client sends the same prompts through each at C concurrent requests, each
prompt once. Reported per front: p50/p99 latency, requests per second, and for the two Python fronts their process's
CPU time per request (from /proc); then the router's added p50 over nginx (target <= 1 ms), its throughput as a
share of nginx's (target >= 0.5x), and its CPU per request against the aiohttp floor's. Last, the two clients a
proxy can send with, in this process over the same shards: aiohttp's and the router's own (router/client.py), CPU
per request each.

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
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from _aiohttp_floor import READY as FLOOR_READY
from _peers import Nginx, ProxySettings
from _proc import cpu_seconds
from rollout_runtime.router.client import ShardClient
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
    cpu_us: float | None = None
    """The front's process CPU time (user + system) per request, in microseconds; None when not measured."""


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@asynccontextmanager
async def aiohttp_floor(urls: Sequence[str]) -> AsyncIterator[tuple[str, int]]:
    """bench/_aiohttp_floor.py in front of ``urls``: its URL and pid while the context is open."""
    script = Path(__file__).with_name("_aiohttp_floor.py")
    process = await asyncio.create_subprocess_exec(sys.executable, str(script), *urls, stdout=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30.0)).decode()
        if not line.startswith(FLOOR_READY):
            raise RuntimeError(f"the aiohttp floor proxy did not start (exit {await process.wait()})")
        yield f"http://127.0.0.1:{int(line.split()[1])}", process.pid
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def drive(front: str, urls: Sequence[str], requests: int, concurrency: int, *, pid: int | None = None) -> Result:
    """``requests`` completions, ``concurrency`` at a time, spread round-robin over ``urls``; ``pid``: the front's
    process, whose CPU time per request is reported."""
    latencies: list[float] = []
    errors = 0
    targets = itertools.cycle(urls)
    counter = iter(range(concurrency))  # the warm-up: one request per connection the measured run will use
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

        await asyncio.gather(*(worker() for _ in range(concurrency)))  # open the connections (not measured)
        latencies.clear()
        errors = 0
        counter = iter(range(requests))
        cpu = cpu_seconds(pid) if pid is not None else 0.0
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        cpu_us = (cpu_seconds(pid) - cpu) / requests * 1e6 if pid is not None else None
    return Result(
        front, _percentile(latencies, 0.5) * 1000, _percentile(latencies, 0.99) * 1000, requests / wall, errors, cpu_us
    )


async def client_cpu(client: str, urls: Sequence[str], requests: int, concurrency: int) -> float:
    """CPU microseconds per request of this process sending ``requests`` completions through ``client``."""
    body = b'{"prompt": "What is 1 + 1?", "max_tokens": 4}'
    shard_client = ShardClient(connect_timeout=5.0, read_timeout=120.0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=120.0)
    headers = {"Content-Type": "application/json"}
    targets = itertools.cycle(urls)
    async with aiohttp.ClientSession(trust_env=False, auto_decompress=False) as session:

        async def one() -> None:
            url = next(targets)
            if client == "router":
                async with await shard_client.request(url, "POST", "/v1/completions", body) as reply:
                    await reply.read(1 << 20)
            else:
                async with session.post(url + "/v1/completions", data=body, headers=headers, timeout=timeout) as r:
                    await r.read()

        async def worker(count: int) -> None:
            for _ in range(count):
                await one()

        await asyncio.gather(*(worker(1) for _ in range(concurrency)))  # one connection each, not measured
        started = time.process_time()
        await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
        spent = time.process_time() - started
    await shard_client.aclose()
    return spent / (requests // concurrency * concurrency) * 1e6


async def main_async(shards: int, requests: int, concurrency: int, latency: float = 0.0) -> None:
    extra = ("--slow", str(latency)) if latency else ()
    async with SimFleet(shards, extra_args=extra) as fleet:
        urls = [shard.endpoint for shard in fleet.shards]
        ports = {shard.name: int(shard.endpoint.rsplit(":", 1)[1]) for shard in fleet.shards}
        results = [await drive("none (direct)", urls, requests, concurrency)]
        settings = ProxySettings(attempt_timeout=30, probe_period=1, probe_timeout=0.5, fall=3, rise=2, tries=3)
        async with Nginx(ports, settings) as nginx:
            results.append(await drive("nginx", [nginx.url], requests, concurrency))
        async with aiohttp_floor(urls) as (floor_url, floor_pid):
            results.append(await drive("aiohttp floor", [floor_url], requests, concurrency, pid=floor_pid))
        args = [a for shard in fleet.shards for a in ("--shard", f"{shard.name}={shard.endpoint}")]
        router = await spawn_router([*args, "--probe-period", "0.5", "--log-level", "WARNING"])
        async with router, aiohttp.ClientSession() as http:
            for _ in range(200):  # the router's probes find the shards (setup, not measured)
                async with http.get(router.url + "/readyz") as response:
                    if response.status == 200 and (await response.json())["routable"] == shards:
                        break
                await asyncio.sleep(0.05)
            results.append(await drive("router", [router.url], requests, concurrency, pid=router.pid))
        clients = {name: await client_cpu(name, urls, requests, concurrency) for name in ("aiohttp", "router")}
    print(f"\n{'front':16} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>7} {'CPU us/req':>11}")
    for r in results:
        cpu = f"{r.cpu_us:11.0f}" if r.cpu_us is not None else f"{'-':>11}"
        print(f"{r.front:16} {r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.rps:8.0f} {r.errors:7d} {cpu}")
    nginx_row, floor_row, router_row = results[1], results[2], results[3]
    print(
        f"\n{MARKER}: added p50 {router_row.p50_ms - nginx_row.p50_ms:+.2f} ms (target <= 1 ms), "
        f"throughput {router_row.rps / nginx_row.rps:.2f}x nginx's (target >= 0.5x), at {concurrency} concurrent"
    )
    assert floor_row.cpu_us is not None
    assert router_row.cpu_us is not None
    print(
        f"the aiohttp floor: added p50 {floor_row.p50_ms - nginx_row.p50_ms:+.2f} ms, throughput "
        f"{floor_row.rps / nginx_row.rps:.2f}x nginx's; the router's CPU per request "
        f"{router_row.cpu_us / floor_row.cpu_us:.2f}x the floor's ({router_row.cpu_us - floor_row.cpu_us:+.0f} us)"
    )
    print(
        f"clients to the shards: the router's {clients['router']:.0f} us CPU per request, aiohttp's "
        f"{clients['aiohttp']:.0f} us ({clients['router'] / clients['aiohttp']:.2f}x)"
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
