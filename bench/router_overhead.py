"""What does ``rollout-fleet router`` add in front of healthy shards? Measured against nginx in the same run.

The same sim shards (real subprocesses, no injected latency, no chaos) behind six fronts: none (the client calls
the shards round-robin itself), nginx (bench/_peers.py's config), the least an aiohttp proxy can do
(bench/_aiohttp_floor.py: an aiohttp server and aiohttp's client, no dispatcher), the field's routers vllm-router and
sglang-router (bench/_field_routers.py: Rust, configured for production) and the router (a subprocess, local
probing). The same client sends the same prompts through each at C concurrent requests, each prompt once, in
interleaved rounds (6 by default; nginx and the router run back to back, and every other round runs the fronts in
reverse order, so that drift of the machine cancels instead of favouring one front). Reported per front, as medians
over the rounds: p50/p99 latency, requests per second, the CPU time per request of each front's processes (nginx:
master and worker) and of the sim shards' (from /proc); then the router's added p50 over direct (target <= 1 ms with
shards that take 0.2 s, ``--latency 0.2``) and over nginx, its throughput and CPU per request as shares of nginx's
(no target: past one core the router scales by replicas), each per round and their median, and the same against
the aiohttp floor's.

The client is bench/loadgen (Go; ``--client python`` for this script's aiohttp client instead). A Python client
costs about as much CPU per request as the Python fronts it measures, on the same two cores, and its own queue of
answers to read joins every front's latency: with it, rounds of the same front moved by more than the 1 ms the
target asks about, and a faster front's throughput was the client's ceiling rather than its own.

    python bench/router_overhead.py              # 4 shards, 64 concurrent, 6 rounds of 6400 requests per front
    python bench/router_overhead.py --latency 0.2 --requests 1600   # shards that take 0.2 s per generation
    python bench/router_overhead.py --smoke      # tiny sizes (CI; no numbers asserted)

With no injected latency the shards answer as fast as they can and the closed loop saturates the machine's CPUs, so
every front's latency is queueing (p50 ~ concurrency / throughput) and the run measures the router's throughput
ceiling; ``--latency`` measures what it adds to a request when nothing saturates.

Needs nginx, the field routers and the load generator: ``bash scripts/install-tools.sh nginx router-peers loadgen``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import resource
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import aiohttp

from _aiohttp_floor import READY as FLOOR_READY
from _field_routers import ROUTERS as FIELD_ROUTERS
from _field_routers import FieldRouter
from _loadgen import loadgen
from _peers import Nginx, ProxySettings
from _proc import cpu_seconds, process_tree
from rollout_runtime.router.process import spawn_router
from rollout_runtime.sim import SimFleet

MARKER = "router overhead vs nginx"
MODEL = "sim-model"
"""The sim shards' model, named in every request: sglang-router refuses a body without one (422)."""


@dataclass(frozen=True)
class Result:
    front: str
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int
    cpu_us: float | None
    """The front's processes' CPU time (user + system) per request, in microseconds (nginx: master and worker);
    None for direct."""
    shards_cpu_us: float
    """The sim shards' CPU time per request, all of them together, in microseconds."""
    client_cpu_us: float
    """The client's CPU time per request, in microseconds."""


def _median(values: Sequence[float]) -> float:
    """The median; nan for no values (a CPU time too small for the clock's ticks in a smoke run)."""
    return median(values) if values else float("nan")


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


async def drive(
    front: str,
    urls: Sequence[str],
    requests: int,
    concurrency: int,
    *,
    client: str,
    front_pids: Sequence[int] = (),
    shard_pids: Sequence[int] = (),
) -> Result:
    """``requests`` completions, ``concurrency`` at a time, spread round-robin over ``urls``, sent by ``client``
    ("go" or "python"); the CPU time per request of ``front_pids`` (the front's processes), of ``shard_pids`` together
    and of the client is reported."""
    pids = [*front_pids, *shard_pids]
    cpu = [cpu_seconds(pid) for pid in pids]
    client_started = _client_cpu(client)
    if client == "go":
        measured = await loadgen(urls, requests, concurrency, MODEL)
        p50, p99, rps, errors = measured.p50_ms, measured.p99_ms, measured.rps, measured.errors
    else:
        p50, p99, rps, errors = await drive_python(urls, requests, concurrency)
    client_us = (_client_cpu(client) - client_started) / (requests + concurrency) * 1e6  # with the warm-up's
    spent = [(cpu_seconds(pid) - before) / requests * 1e6 for pid, before in zip(pids, cpu, strict=True)]
    front_us = sum(spent[: len(front_pids)]) if front_pids else None
    del spent[: len(front_pids)]
    return Result(front, p50, p99, rps, errors, front_us, sum(spent), client_us)


def _client_cpu(client: str) -> float:
    """CPU seconds the client has used so far: bench/loadgen's are a reaped child's (the only child reaped before
    the run ends), aiohttp's this process's own."""
    if client == "go":
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime
    return time.process_time()


async def drive_python(urls: Sequence[str], requests: int, concurrency: int) -> tuple[float, float, float, int]:
    """The same closed loop as bench/loadgen, in this process with aiohttp's client: (p50 ms, p99 ms, rps, errors)."""
    latencies: list[float] = []
    errors = 0
    targets = itertools.cycle(urls)
    counter = iter(range(concurrency))  # the warm-up: one request per connection the measured run will use
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def worker() -> None:
            nonlocal errors
            for index in counter:
                body = {"model": MODEL, "prompt": f"What is {index} + 1?", "max_tokens": 4}
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
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return _percentile(latencies, 0.5) * 1000, _percentile(latencies, 0.99) * 1000, requests / wall, errors


async def main_async(
    shards: int, requests: int, concurrency: int, latency: float = 0.0, rounds: int = 6, client: str = "go"
) -> None:
    extra = ("--slow", str(latency)) if latency else ()
    settings = ProxySettings(attempt_timeout=30, probe_period=1, probe_timeout=0.5, fall=3, rise=2, tries=3)
    async with AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(SimFleet(shards, extra_args=extra, model=MODEL))
        urls = [shard.endpoint for shard in fleet.shards]
        shard_pids = [pid for name in fleet.names if (pid := fleet.pid(name)) is not None]
        ports = {shard.name: int(shard.endpoint.rsplit(":", 1)[1]) for shard in fleet.shards}
        nginx = await stack.enter_async_context(Nginx(ports, settings))
        floor_url, floor_pid = await stack.enter_async_context(aiohttp_floor(urls))
        field = [await stack.enter_async_context(FieldRouter(name, urls, settings)) for name in FIELD_ROUTERS]
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
        fronts: list[tuple[str, list[str], list[int]]] = [
            ("none (direct)", urls, []),
            ("nginx", [nginx.url], process_tree(nginx.pid)),
            ("router", [router.url], [router.pid]),
            ("aiohttp floor", [floor_url], [floor_pid]),
            *((peer.name, [peer.url], [peer.pid]) for peer in field),
        ]
        runs: dict[str, list[Result]] = {name: [] for name, _, _ in fronts}
        for index in range(rounds):
            # Interleaved, nginx and the router back to back and every other round in reverse (ABBA): the drift of
            # the machine between the two fronts compared cancels over the rounds instead of adding to one side.
            for name, targets, pids in fronts if index % 2 == 0 else fronts[::-1]:
                result = await drive(
                    name, targets, requests, concurrency, client=client, front_pids=pids, shard_pids=shard_pids
                )
                runs[name].append(result)
    sender = "bench/loadgen (Go)" if client == "go" else "aiohttp in this process"
    print(f"\n{rounds} interleaved round(s) of {requests} requests per front, sent by {sender}; medians of the rounds")
    header = f"{'front':16} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>7}"
    print(f"{header} {'CPU us/req':>11} {'shards us/req':>14} {'client us/req':>14}")

    def cpu_of(front: str) -> list[float]:
        return [r.cpu_us for r in runs[front] if r.cpu_us is not None]

    for name, results in runs.items():
        cpu = f"{median(cpu_of(name)):11.0f}" if cpu_of(name) else f"{'-':>11}"
        p50, p99 = median([r.p50_ms for r in results]), median([r.p99_ms for r in results])
        rps, errors = median([r.rps for r in results]), sum(r.errors for r in results)
        shards_cpu, client_us = median([r.shards_cpu_us for r in results]), median([r.client_cpu_us for r in results])
        print(f"{name:16} {p50:8.2f} {p99:8.2f} {rps:8.0f} {errors:7d} {cpu} {shards_cpu:14.0f} {client_us:14.0f}")

    def per_round(front: str, against: str) -> tuple[list[float], list[float], list[float]]:
        """Per round: the front's added p50 over ``against``'s (ms), its throughput and its CPU per request as
        shares of ``against``'s (CPU: only where both were measured)."""
        pairs = list(zip(runs[front], runs[against], strict=True))
        cpu = [f.cpu_us / a.cpu_us for f, a in pairs if f.cpu_us and a.cpu_us]
        return [f.p50_ms - a.p50_ms for f, a in pairs], [f.rps / a.rps for f, a in pairs], cpu

    def rounds_of(values: list[float], spec: str) -> str:
        return ", ".join(format(value, spec) for value in values)

    over_direct, _, _ = per_round("router", "none (direct)")
    added, shares, cpu_shares = per_round("router", "nginx")
    print(
        f"\n{MARKER}: added p50 {_median(over_direct):+.2f} ms over direct (target <= 1 ms; rounds "
        f"{rounds_of(over_direct, '+.2f')}), {_median(added):+.2f} ms over nginx; throughput {_median(shares):.2f}x "
        f"nginx's (rounds {rounds_of(shares, '.2f')}); CPU per request {_median(cpu_of('router')):.0f} us, "
        f"{_median(cpu_shares):.2f}x nginx's {_median(cpu_of('nginx')):.0f} us; at {concurrency} concurrent"
    )
    for peer in FIELD_ROUTERS:
        peer_added, peer_shares, peer_cpu = per_round("router", peer)
        print(
            f"against {peer}: the router's added p50 {_median(peer_added):+.2f} ms, its throughput "
            f"{_median(peer_shares):.2f}x {peer}'s, its CPU per request {_median(peer_cpu):.2f}x {peer}'s "
            f"{_median(cpu_of(peer)):.0f} us"
        )
    _, floor_shares, _ = per_round("aiohttp floor", "nginx")
    floor_added, _, floor_cpu = per_round("router", "aiohttp floor")
    print(
        f"the aiohttp floor: throughput {_median(floor_shares):.2f}x nginx's; the router's added p50 over it "
        f"{_median(floor_added):+.2f} ms, its CPU per request {_median(floor_cpu):.2f}x the floor's"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs, not the numbers")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--requests", type=int, default=6400)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each shard takes per generation")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds of every front (medians reported)")
    parser.add_argument(
        "--client", choices=("go", "python"), default="go", help="bench/loadgen, or aiohttp in this process"
    )
    options = parser.parse_args()
    if options.smoke:
        asyncio.run(main_async(2, 100, 16, rounds=2, client=options.client))
    else:
        asyncio.run(
            main_async(
                options.shards, options.requests, options.concurrency, options.latency, options.rounds, options.client
            )
        )


if __name__ == "__main__":
    main()
