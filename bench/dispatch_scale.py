"""Benchmark 2: Dispatcher overhead and scale, each number beside a bare loop measured in the same run.

Extends bench/dispatch_overhead.py (the zero-latency rollout, bare semaphore loop and timer of bench/_support.py
are shared, not copied) along the axes the issue asks for:

A. queue and concurrency: 1k, 10k, 100k prompts x 10, 100, 1,000 concurrent, zero-latency in-process rollouts
   (``_support.yields_once``: one trip through the event loop, as any real I/O makes);
   microseconds per attempt for the bare asyncio loop and the Dispatcher, their ratio, and the growth of the
   Dispatcher's per-attempt cost from the smallest to the largest queue (linear total cost = flat per attempt;
   quadratic would multiply it by the queue growth, 100x).
B. shard count: 10k prompts, 100 concurrent, 1 to 1,000 shards in the healthy set. Selection scans small fleets
   exactly and samples large ones (power-of-two-choices, see rollout_runtime.dispatch.selection), so the
   per-attempt cost stays flat with the shard count.
D. selection alone: pick_shard per attempt at 1 to 1,000 shards beside the exact scan it replaced.
C. real HTTP: fast simulated shards (real subprocesses, no added latency); a raw aiohttp loop (one session,
   round-robin, semaphore), the same loop through GenerationClient, and the Dispatcher with GenerationClient. What
   the dispatcher adds on top of real requests, at 10 and 100 concurrent.

    python bench/dispatch_scale.py            # full run (~5 minutes)
    python bench/dispatch_scale.py --smoke    # tiny sizes (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from _support import Rollout, bare_semaphore_loop, timed, yields_once
from rollout_runtime.dispatch import Completed, Dispatcher, DispatchPolicy
from rollout_runtime.generation import GenerationClient, GenerationOptions
from rollout_runtime.shards import Shard, StaticShardSource
from rollout_runtime.sim import SimFleet

MARKER = "dispatch scale ratios"


def shards_of(count: int) -> list[Shard]:
    return [Shard(name=f"shard-{i:04d}", endpoint=f"http://127.0.0.1:{10000 + i}") for i in range(count)]


def dispatcher_over(shards: Sequence[Shard]) -> Callable[[list[int], int, Rollout], Coroutine[Any, Any, int]]:
    """dispatch_overhead's dispatcher loop, over a healthy set of any size (a fresh private metrics registry)."""

    async def loop(prompts: list[int], concurrency: int, rollout: Rollout) -> int:
        policy = DispatchPolicy(max_concurrency=concurrency)
        done = 0
        async with Dispatcher(StaticShardSource(shards), policy, registry=CollectorRegistry()) as dispatcher:
            async for outcome in dispatcher.run(prompts, rollout):
                done += isinstance(outcome, Completed)
        return done

    loop.__name__ = f"dispatcher_{len(shards)}_shards"
    return loop


def best_us(
    runner: Callable[[list[int], int, Rollout], Coroutine[Any, Any, int]], count: int, concurrency: int, repeat: int
) -> float:
    """Best microseconds per attempt; the rollout yields to the loop once (as real I/O does) and returns."""
    prompts = list(range(count))
    return min(timed(runner, prompts, concurrency, yields_once) for _ in range(repeat)) / count * 1e6


# -- A. queue x concurrency -------------------------------------------------------------------------------------


def queue_and_concurrency(counts: Sequence[int], concurrencies: Sequence[int], repeat: int) -> dict[str, float]:
    print(
        f"A. zero-latency rollouts (yield once), 4 shards: us per attempt (best of {repeat}), "
        "bare asyncio loop vs Dispatcher"
    )
    print(f"   {'prompts':>8} {'concurrent':>10} {'bare us':>8} {'dispatcher us':>13} {'ratio':>6} {'attempts/s':>11}")
    shards = shards_of(4)
    ours: dict[tuple[int, int], float] = {}
    ratios: list[float] = []
    for count, concurrency in itertools.product(counts, concurrencies):
        bare = ours_us = float("inf")
        for _ in range(repeat):  # interleaved, so drift in machine load hits both alike
            bare = min(bare, best_us(bare_semaphore_loop, count, concurrency, 1))
            ours_us = min(ours_us, best_us(dispatcher_over(shards), count, concurrency, 1))
        ours[count, concurrency] = ours_us
        ratios.append(ours_us / bare)
        print(
            f"   {count:>8,} {concurrency:>10,} {bare:8.2f} {ours_us:13.2f} {ours_us / bare:5.2f}x "
            f"{1e6 / ours_us:>11,.0f}"
        )
    growth = max(ours[counts[-1], c] / ours[counts[0], c] for c in concurrencies)
    return {"median ratio": statistics.median(ratios), "queue growth": growth}


# -- B. shard count ---------------------------------------------------------------------------------------------


def shard_count(count: int, concurrency: int, shard_counts: Sequence[int], repeat: int) -> dict[str, float]:
    print(f"\nB. shard count: {count:,} zero-latency prompts, {concurrency} concurrent: us per attempt")
    print(f"   {'shards':>7} {'dispatcher us':>13} {'slope vs previous row':>22}")
    results: dict[int, float] = {}
    previous: int | None = None
    for shards in shard_counts:
        results[shards] = best_us(dispatcher_over(shards_of(shards)), count, concurrency, repeat)
        slope = (
            ""
            if previous is None
            else f"{(results[shards] - results[previous]) / (shards - previous) * 1000:.0f} ns/shard"
        )
        print(f"   {shards:>7,} {results[shards]:13.2f} {slope:>22}")
        previous = shards
    first, last = shard_counts[0], shard_counts[-1]
    return {"shard growth": results[last] / results[first], "shard factor": last / first}


# -- D. selection alone ------------------------------------------------------------------------------------------


def selection_cost(shard_counts: Sequence[int], picks: int, repeat: int) -> dict[str, float]:
    """pick_shard per attempt at each fleet size, beside the exact scan it replaced beyond EXACT_SCAN_MAX (the
    same function, ``selection._scan``, so both run in this process), with a retry's last_failed and tried."""
    from rollout_runtime.dispatch import ShardLoad, pick_shard
    from rollout_runtime.dispatch.selection import _scan

    print(f"\nD. selection alone: ns per pick (best of {repeat}), {picks:,} picks, load tracked, a retry every 4th")
    print(f"   {'shards':>7} {'exact scan ns':>13} {'pick_shard ns':>13} {'vs 4 shards':>11}")
    results: dict[int, float] = {}
    for count in shard_counts:
        loads = [ShardLoad(shard) for shard in shards_of(count)]

        def run(chooser: Callable[..., Any], loads: list[ShardLoad] = loads) -> float:
            start = time.perf_counter()
            for i in range(picks):
                retry = i % 4 == 0
                picked = chooser(loads, i, loads[i % len(loads)].name if retry else None, ())
                picked.outstanding += 1
                if i % 2:
                    picked.outstanding -= 1
            for load in loads:
                load.outstanding = 0
            return (time.perf_counter() - start) / picks * 1e9

        def new(loads: list[ShardLoad], i: int, failed: str | None, tried: tuple[str, ...]) -> Any:
            return pick_shard(loads, start=i, last_failed=failed, tried=tried)

        scan_ns = min(run(_scan) for _ in range(repeat))
        results[count] = min(run(new) for _ in range(repeat))
        reference = results.get(4, results[count])
        print(f"   {count:>7,} {scan_ns:13.0f} {results[count]:13.0f} {results[count] / reference:10.2f}x")
    largest = shard_counts[-1]
    return {"selection us at largest": results[largest] / 1000, "selection vs 4": results[largest] / results[4]}


# -- C. real HTTP -----------------------------------------------------------------------------------------------


async def raw_aiohttp(shards: Sequence[Shard], prompts: list[str], concurrency: int) -> int:
    semaphore = asyncio.Semaphore(concurrency)
    ok = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:

        async def one(index: int, prompt: str) -> None:
            nonlocal ok
            shard = shards[index % len(shards)]
            payload = {"model": shard.model, "prompt": prompt, "max_tokens": 16}
            async with semaphore, session.post(shard.endpoint + "/v1/completions", json=payload) as response:
                await response.read()
                ok += response.status == 200

        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return ok


async def generation_client_loop(shards: Sequence[Shard], prompts: list[str], concurrency: int) -> int:
    semaphore = asyncio.Semaphore(concurrency)
    async with GenerationClient(max_connections=concurrency) as client:

        async def one(index: int, prompt: str) -> bool:
            async with semaphore:
                await client.complete(shards[index % len(shards)], prompt, max_tokens=16)
                return True

        return sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


async def dispatcher_http(shards: Sequence[Shard], prompts: list[str], concurrency: int) -> int:
    policy = DispatchPolicy(max_concurrency=concurrency)
    done = 0
    async with (
        GenerationClient(max_connections=concurrency) as client,
        Dispatcher(StaticShardSource(shards), policy, registry=CollectorRegistry()) as dispatcher,
    ):

        async def rollout(shard: Shard, prompt: str) -> str:
            return (await client.complete(shard, prompt, max_tokens=16)).text

        async for outcome in dispatcher.run(prompts, rollout):
            done += isinstance(outcome, Completed)
    return done


async def real_http(count: int, concurrencies: Sequence[int], sims: int, repeat: int) -> dict[str, float]:
    print(
        f"\nC. real HTTP: {count:,} prompts to {sims} fast sim shards (real processes): "
        f"us per request, best of {repeat}"
    )
    print(f"   {'concurrent':>10} {'raw aiohttp':>11} {'GenerationClient':>16} {'Dispatcher':>10} {'disp/raw':>8}")
    prompts = [f"What is {i} + {i % 97}?" for i in range(count)]
    loops = {"raw": raw_aiohttp, "client": generation_client_loop, "dispatcher": dispatcher_http}
    ratios = []
    async with SimFleet(sims) as fleet:
        shards = fleet.shards
        for concurrency in concurrencies:
            best = dict.fromkeys(loops, float("inf"))
            for _ in range(repeat):  # interleaved
                for name, loop in loops.items():
                    start = time.perf_counter()
                    done = await loop(shards, prompts, concurrency)
                    elapsed = time.perf_counter() - start
                    if done != count:
                        raise RuntimeError(f"{name} completed {done} of {count}")
                    best[name] = min(best[name], elapsed / count * 1e6)
            ratios.append(best["dispatcher"] / best["raw"])
            print(
                f"   {concurrency:>10} {best['raw']:11.1f} {best['client']:16.1f} {best['dispatcher']:10.1f} "
                f"{ratios[-1]:7.2f}x"
            )
    return {"http ratio": max(ratios)}


# -- E. streaming parse cost -------------------------------------------------------------------------------------

STREAM_PROMPT = "echo " + " ".join(f"t{i}" for i in range(47))


async def raw_sse(shards: Sequence[Shard], count: int, concurrency: int) -> int:
    """The floor: aiohttp, one session, every ``data:`` line json-decoded, the text deltas joined."""
    semaphore = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    ok = 0
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:

        async def one(index: int) -> None:
            nonlocal ok
            shard = shards[index % len(shards)]
            payload = {"model": shard.model, "prompt": STREAM_PROMPT, "max_tokens": 64, "stream": True}
            async with semaphore, session.post(shard.endpoint + "/v1/completions", json=payload) as response:
                parts = []
                async for line in response.content:
                    if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                        parts.extend(c.get("text", "") for c in json.loads(line[5:])["choices"])
                ok += "".join(parts) == STREAM_PROMPT

        await asyncio.gather(*(one(i) for i in range(count)))
    return ok


async def client_sse(shards: Sequence[Shard], count: int, concurrency: int) -> int:
    """GenerationClient streaming into typed results (progress reported per chunk, as under the dispatcher)."""
    semaphore = asyncio.Semaphore(concurrency)
    options = GenerationOptions(stream=True)
    async with GenerationClient(max_connections=concurrency) as client:

        async def one(index: int) -> bool:
            async with semaphore:
                completion = await client.complete(shards[index % len(shards)], STREAM_PROMPT, options=options)
                return completion.text == STREAM_PROMPT

        return sum(await asyncio.gather(*(one(i) for i in range(count))))


async def streaming_parse(count: int, concurrency: int, sims: int, repeat: int) -> dict[str, float]:
    print(f"\nE. streaming: {count:,} streamed completions (48 chunks), {concurrency} concurrent, {sims} sims")
    print(f"   {'raw aiohttp SSE us':>18} {'GenerationClient us':>19} {'ratio':>6}")
    best = {"raw": float("inf"), "client": float("inf")}
    async with SimFleet(sims) as fleet:
        for _ in range(repeat):  # interleaved
            for name, loop in (("raw", raw_sse), ("client", client_sse)):
                start = time.perf_counter()
                done = await loop(fleet.shards, count, concurrency)
                if done != count:
                    raise RuntimeError(f"{name} streamed {done} of {count} correctly")
                best[name] = min(best[name], (time.perf_counter() - start) / count * 1e6)
    ratio = best["client"] / best["raw"]
    print(f"   {best['raw']:18.1f} {best['client']:19.1f} {ratio:5.2f}x")
    return {"stream ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = parser.parse_args()
    if args.smoke:
        a = queue_and_concurrency([100, 1_000], [10, 100], repeat=1)
        b = shard_count(1_000, 10, [1, 100], repeat=1)
        c = asyncio.run(real_http(200, [10], sims=2, repeat=1))
        d = selection_cost([1, 4, 100], 2_000, repeat=1)
        e = asyncio.run(streaming_parse(50, 10, sims=2, repeat=1))
    else:
        a = queue_and_concurrency([1_000, 10_000, 100_000], [10, 100, 1_000], repeat=3)
        b = shard_count(10_000, 100, [1, 4, 10, 100, 1_000], repeat=3)
        c = asyncio.run(real_http(5_000, [10, 100], sims=4, repeat=3))
        d = selection_cost([1, 4, 10, 100, 1_000], 50_000, repeat=3)
        e = asyncio.run(streaming_parse(1_000, 32, sims=4, repeat=3))
    print(f"\n{MARKER}:")
    print(f"  Dispatcher / bare loop, zero-latency (median over the grid): {a['median ratio']:.2f}x")
    print(f"  per-attempt cost, largest queue / smallest (linear = ~1x):   {a['queue growth']:.2f}x")
    print(
        f"  per-attempt cost, {b['shard factor']:.0f}x the shards:                  {b['shard growth']:.2f}x "
        "(flat: two choices beyond the exact-scan size)"
    )
    print(f"  Dispatcher + GenerationClient / raw aiohttp, real HTTP (worst): {c['http ratio']:.2f}x")
    print(
        f"  selection per attempt at the largest fleet: {d['selection us at largest']:.2f} us, "
        f"{d['selection vs 4']:.2f}x the 4-shard cost"
    )
    print(f"  streamed completions, GenerationClient / raw aiohttp SSE loop: {e['stream ratio']:.2f}x")


if __name__ == "__main__":
    main()
