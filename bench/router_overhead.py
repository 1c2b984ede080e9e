"""What does ``rollout-fleet router`` add in front of healthy shards? Measured against nginx in the same run.

The same sim shards (real subprocesses, no injected latency, no chaos) behind four fronts: none (the client calls
the shards round-robin itself), nginx (bench/_peers.py's config), the least an aiohttp proxy can do
(bench/_aiohttp_floor.py: an aiohttp server and aiohttp's client, no dispatcher) and the router (a subprocess, local
probing). The same client sends the same prompts through each at C concurrent requests, each prompt once, in
interleaved rounds (6 by default; nginx and the router run back to back, and every other round runs the fronts in
reverse order, so that drift of the machine cancels instead of favouring one front). Reported per front, as medians
over the rounds: p50/p99 latency, requests per second, and for the two Python fronts their process's CPU time per
request (from /proc); then the router's added p50 over nginx (target <= 1 ms) and its throughput as a share of
nginx's (target >= 0.5x), each per round and their median, and its CPU per request against the aiohttp floor's.
Then the paired rounds: the same C workers send to nginx and to the router in turn, request by request, so both
fronts are measured in the same waves of the same shards at the same moments (C/2 requests in flight through each,
C at the shards, as in the rounds above); the router's added p50 over nginx per paired round and their median. The
separate rounds answer the target's question as asked (C concurrent through one front); with shards that take a
fixed time the closed loop moves in waves whose shape differs from round to round, and the paired rounds take that
variance out of the comparison. Last, the two clients a proxy can send with, in this process over the same shards:
aiohttp's and the router's own (router/client.py), CPU per request each.

    python bench/router_overhead.py              # 4 shards, 64 concurrent, 6 rounds of 6400 requests per front
    python bench/router_overhead.py --latency 0.2 --requests 1600   # shards that take 0.2 s per generation
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
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import median

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


async def drive_paired(
    fronts: Sequence[tuple[str, str]], requests: int, concurrency: int
) -> dict[str, tuple[float, float]]:
    """``requests`` completions, ``concurrency`` at a time, each worker sending to the ``fronts`` (name, URL) in
    turn and each starting at a different one; each front's (p50 ms, p99 ms) over its requests."""
    latencies: dict[str, list[float]] = {name: [] for name, _ in fronts}
    errors = 0
    counter = iter(range(concurrency * len(fronts)))  # the warm-up: every worker's connection to every front
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency * len(fronts))) as http:

        async def worker(offset: int) -> None:
            nonlocal errors
            turn = itertools.cycle(fronts[offset % len(fronts) :] + fronts[: offset % len(fronts)])
            for index in counter:
                name, url = next(turn)
                body = {"prompt": f"What is {index} + 1?", "max_tokens": 4}
                started = time.perf_counter()
                async with http.post(url + "/v1/completions", json=body) as response:
                    await response.read()
                    errors += response.status != 200
                latencies[name].append(time.perf_counter() - started)

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        for values in latencies.values():
            values.clear()
        counter = iter(range(requests))
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    if errors:
        raise RuntimeError(f"{errors} paired request(s) failed: the comparison would not be like for like")
    return {name: (_percentile(v, 0.5) * 1000, _percentile(v, 0.99) * 1000) for name, v in latencies.items()}


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


async def main_async(shards: int, requests: int, concurrency: int, latency: float = 0.0, rounds: int = 6) -> None:
    extra = ("--slow", str(latency)) if latency else ()
    settings = ProxySettings(attempt_timeout=30, probe_period=1, probe_timeout=0.5, fall=3, rise=2, tries=3)
    async with AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(SimFleet(shards, extra_args=extra))
        urls = [shard.endpoint for shard in fleet.shards]
        ports = {shard.name: int(shard.endpoint.rsplit(":", 1)[1]) for shard in fleet.shards}
        nginx = await stack.enter_async_context(Nginx(ports, settings))
        floor_url, floor_pid = await stack.enter_async_context(aiohttp_floor(urls))
        args = [a for shard in fleet.shards for a in ("--shard", f"{shard.name}={shard.endpoint}")]
        router = await stack.enter_async_context(
            await spawn_router([*args, "--probe-period", "0.5", "--log-level", "WARNING"])
        )
        async with aiohttp.ClientSession() as http:
            for _ in range(200):  # the router's probes find the shards (setup, not measured)
                async with http.get(router.url + "/readyz") as response:
                    if response.status == 200 and (await response.json())["routable"] == shards:
                        break
                await asyncio.sleep(0.05)
        fronts: list[tuple[str, list[str], int | None]] = [
            ("none (direct)", urls, None),
            ("nginx", [nginx.url], None),
            ("router", [router.url], router.pid),
            ("aiohttp floor", [floor_url], floor_pid),
        ]
        runs: dict[str, list[Result]] = {name: [] for name, _, _ in fronts}
        for index in range(rounds):
            # Interleaved, nginx and the router back to back and every other round in reverse (ABBA): the drift of
            # the machine between the two fronts compared cancels over the rounds instead of adding to one side.
            for name, targets, pid in fronts if index % 2 == 0 else fronts[::-1]:
                runs[name].append(await drive(name, targets, requests, concurrency, pid=pid))
        paired = [
            await drive_paired([("nginx", nginx.url), ("router", router.url)], requests, concurrency)
            for _ in range(rounds)
        ]
        clients = {name: await client_cpu(name, urls, requests, concurrency) for name in ("aiohttp", "router")}
    print(f"\n{rounds} interleaved round(s) of {requests} requests per front; medians over the rounds")
    print(f"{'front':16} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>7} {'CPU us/req':>11}")

    def cpu_of(front: str) -> list[float]:
        return [r.cpu_us for r in runs[front] if r.cpu_us is not None]

    for name, results in runs.items():
        cpu = f"{median(cpu_of(name)):11.0f}" if cpu_of(name) else f"{'-':>11}"
        p50, p99 = median([r.p50_ms for r in results]), median([r.p99_ms for r in results])
        rps, errors = median([r.rps for r in results]), sum(r.errors for r in results)
        print(f"{name:16} {p50:8.2f} {p99:8.2f} {rps:8.0f} {errors:7d} {cpu}")

    def ratios(front: str) -> tuple[list[float], list[float]]:
        """Per round: the front's added p50 over nginx's (ms) and its throughput as a share of nginx's."""
        pairs = list(zip(runs[front], runs["nginx"], strict=True))
        return [f.p50_ms - n.p50_ms for f, n in pairs], [f.rps / n.rps for f, n in pairs]

    def rounds_of(values: list[float], spec: str) -> str:
        return ", ".join(format(value, spec) for value in values)

    added, shares = ratios("router")
    print(
        f"\n{MARKER}: added p50 {median(added):+.2f} ms (target <= 1 ms; rounds {rounds_of(added, '+.2f')}), "
        f"throughput {median(shares):.2f}x nginx's (target >= 0.5x; rounds {rounds_of(shares, '.2f')}), "
        f"at {concurrency} concurrent"
    )
    floor_added, floor_shares = ratios("aiohttp floor")
    router_cpu, floor_cpu = cpu_of("router"), cpu_of("aiohttp floor")
    print(
        f"the aiohttp floor: added p50 {median(floor_added):+.2f} ms, throughput {median(floor_shares):.2f}x "
        f"nginx's; the router's CPU per request {median(router_cpu) / median(floor_cpu):.2f}x the floor's "
        f"({median(router_cpu) - median(floor_cpu):+.0f} us)"
    )
    paired_added = [pair["router"][0] - pair["nginx"][0] for pair in paired]
    paired_p99 = [pair["router"][1] - pair["nginx"][1] for pair in paired]
    print(
        f"paired (nginx and the router in turn, in the same waves, {concurrency // 2} in flight through each): added "
        f"p50 {median(paired_added):+.2f} ms (rounds {rounds_of(paired_added, '+.2f')}), added p99 "
        f"{median(paired_p99):+.2f} ms"
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
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds of every front (medians reported)")
    options = parser.parse_args()
    if options.smoke:
        asyncio.run(main_async(2, 100, 16, rounds=2))
    else:
        asyncio.run(main_async(options.shards, options.requests, options.concurrency, options.latency, options.rounds))


if __name__ == "__main__":
    main()
