"""What does the Dispatcher cost, and what does it buy? Both measured in the same run, against plain peers.

1. Overhead: N prompts through a zero-latency in-process rollout (one that returns at once, and one that yields to
   the loop once, as any real I/O does), ``max_concurrency`` C, against a bare asyncio loop (a task per prompt
   behind an ``asyncio.Semaphore(C)``, results gathered). Prints microseconds per attempt for both, the ratio
   (target < 1.5x) and attempts per second on one core (target >= 20,000).
2. Value: N prompts against four in-process shards under a chaos schedule (one dies, one hangs, one flaps; the
   probes are simulated with the real hysteresis state machine), against a naive loop that retries on the same
   shard with the same budget, backoff and attempt timeout. Prints completed prompts within the same deadline.

    python bench/dispatch_overhead.py            # full run
    python bench/dispatch_overhead.py --smoke    # tiny sizes, used by the test suite so the script cannot rot
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from _support import SHARDS, Rollout, bare_semaphore_loop, returns_at_once, timed, yields_once
from rollout_runtime.dispatch import Completed, Dispatcher, DispatchPolicy
from rollout_runtime.failures import GenerationUnavailable
from rollout_runtime.health import HealthState, ProbeReason, ProbeResult, ProbeSettings
from rollout_runtime.shards import HealthySet, Shard, StaticShardSource
from rollout_runtime.sim.chaos import Fault, FaultKind, FaultSchedule
from rollout_runtime.sim.shard import flap_is_down

# -- 1. overhead ---------------------------------------------------------------------------------------------------


async def dispatcher_loop(prompts: list[int], concurrency: int, rollout: Rollout) -> int:
    policy = DispatchPolicy(max_concurrency=concurrency)
    done = 0
    async with Dispatcher(StaticShardSource(SHARDS), policy) as dispatcher:
        async for outcome in dispatcher.run(prompts, rollout):
            done += isinstance(outcome, Completed)
    return done


def overhead(count: int, concurrency: int, repeat: int) -> None:
    prompts = list(range(count))
    print(f"1. overhead: {count} prompts, in-process rollout, concurrency {concurrency}, best of {repeat}")
    for rollout in (returns_at_once, yields_once):
        bare: list[float] = []
        ours: list[float] = []
        for _ in range(repeat):  # interleaved, so drift in machine load hits both alike
            bare.append(timed(bare_semaphore_loop, prompts, concurrency, rollout))
            ours.append(timed(dispatcher_loop, prompts, concurrency, rollout))
        bare_us, ours_us = min(bare) / count * 1e6, min(ours) / count * 1e6
        median = statistics.median(ours) / statistics.median(bare)
        print(f"   rollout {rollout.__name__}:")
        print(f"     bare asyncio semaphore loop : {bare_us:6.2f} us/attempt ({count / min(bare):>8,.0f} attempts/s)")
        print(f"     Dispatcher                  : {ours_us:6.2f} us/attempt ({count / min(ours):>8,.0f} attempts/s)")
        print(f"     ratio                       : {ours_us / bare_us:6.2f}x (median {median:.2f}x; target < 1.5x)")


# -- 2. value under chaos ------------------------------------------------------------------------------------------


LATENCY = 0.01
"""Seconds per in-process rollout on a healthy shard."""
FOREVER = 3600.0
CHAOS = FaultSchedule.of(
    [
        Fault(kind=FaultKind.SHARD_KILL, target="shard-0", at_seconds=0.1, hold_seconds=FOREVER),
        Fault(kind=FaultKind.SHARD_HANG, target="shard-1", at_seconds=0.2, hold_seconds=FOREVER),
        Fault(kind=FaultKind.ERROR_BURST_5XX, target="shard-2", at_seconds=0.3, hold_seconds=FOREVER, flap_seconds=0.1),
    ]
)
"""shard-0 dies, shard-1 hangs, shard-2 flaps: the sim's schedule model, followed here without processes."""


def shard_state(schedule: FaultSchedule, name: str, t: float) -> str:
    """What an in-process shard does at ``t`` seconds: the schedule's faults, applied by hand."""
    for fault in schedule.active(name, t):
        if fault.kind is FaultKind.SHARD_KILL:
            return "dead"
        if fault.kind is FaultKind.SHARD_HANG:
            return "hung"
        if fault.flap_seconds is None or flap_is_down(t - (fault.at_seconds or 0.0), fault.flap_seconds):
            return "down"
    return "up"


class ChaosFleet:
    """Four in-process shards following a schedule, and simulated probes feeding the real hysteresis."""

    def __init__(self, chaos: FaultSchedule, probes: ProbeSettings) -> None:
        self.chaos = chaos
        self.probes = probes
        self.start = time.monotonic()
        self.forever = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self.start

    async def rollout(self, shard: Shard, prompt: int) -> int:
        state = shard_state(self.chaos, shard.name, self.now())
        if state == "dead":
            raise ConnectionRefusedError(f"{shard.name}: connection refused")
        if state == "hung":
            await self.forever.wait()
        if state == "down":
            raise GenerationUnavailable(f"{shard.name}: 503", status=503)
        await asyncio.sleep(LATENCY)
        return prompt

    async def snapshots(self) -> AsyncIterator[HealthySet]:
        states = {shard.name: HealthState(self.probes) for shard in SHARDS}
        ok_at: dict[str, float] = {}
        while True:
            for name, state in states.items():
                if shard_state(self.chaos, name, self.now()) == "up":
                    state.observe(ProbeResult.success())
                    ok_at[name] = time.time()
                else:
                    state.observe(ProbeResult.failure(ProbeReason.CONNECT, "down"))
            yield HealthySet.of([s for s in SHARDS if states[s.name].serving], ok_at)
            await asyncio.sleep(self.probes.period_seconds)


@dataclass
class Tally:
    completed: int = 0
    finished: bool = False
    wall: float = 0.0

    def row(self, count: int, deadline: float) -> str:
        ending = f"all done in {self.wall:.2f}s" if self.finished else f"still running at the {deadline:g}s deadline"
        return f"{self.completed:5d}/{count} completed, {ending}"


async def naive_chaos(
    count: int, concurrency: int, policy: DispatchPolicy, chaos: FaultSchedule, deadline: float
) -> Tally:
    """Each prompt is pinned to a shard (round-robin) and retried there, with the dispatcher's budget and backoff."""
    fleet = ChaosFleet(chaos, ProbeSettings())
    semaphore = asyncio.Semaphore(concurrency)
    timeout = policy.attempt_timeout_seconds
    tally = Tally()

    async def one(prompt: int) -> None:
        shard = SHARDS[prompt % len(SHARDS)]
        async with semaphore:
            for attempt in range(policy.max_infra_attempts):
                try:
                    async with asyncio.timeout(timeout):
                        await fleet.rollout(shard, prompt)
                    tally.completed += 1
                    return
                except Exception:
                    delay = policy.backoff_initial_seconds * policy.backoff_multiplier**attempt
                    await asyncio.sleep(min(delay, policy.backoff_max_seconds))

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(deadline):
            await asyncio.gather(*(one(p) for p in range(count)))
            tally.finished = True
    tally.wall = fleet.now()
    return tally


async def dispatcher_chaos(
    count: int, concurrency: int, policy: DispatchPolicy, chaos: FaultSchedule, deadline: float
) -> Tally:
    probes = ProbeSettings(period_seconds=0.05, timeout_seconds=0.04, failure_threshold=2, success_threshold=1)
    fleet = ChaosFleet(chaos, probes)
    tally = Tally()

    class Source:
        def snapshots(self) -> AsyncIterator[HealthySet]:
            return fleet.snapshots()

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(deadline), Dispatcher(Source(), policy, seed=0) as dispatcher:
            async for outcome in dispatcher.run(range(count), fleet.rollout):
                tally.completed += isinstance(outcome, Completed)
            tally.finished = True
    tally.wall = fleet.now()
    return tally


def value(count: int, concurrency: int, deadline: float) -> None:
    chaos = CHAOS
    policy = DispatchPolicy(
        max_concurrency=concurrency,
        attempt_timeout_seconds=1.0,
        backoff_initial_seconds=0.05,
        backoff_max_seconds=0.5,
        ejection_base_seconds=0.5,
        ejection_max_seconds=5,
        # Count what is lost instead of ending the run.
        max_skipped_prompts=count,
        max_consecutive_dropped_prompts=count,
        min_step_batch_fraction=0.01,
    )
    naive = asyncio.run(naive_chaos(count, concurrency, policy, chaos, deadline))
    ours = asyncio.run(dispatcher_chaos(count, concurrency, policy, chaos, deadline))
    print(
        f"2. chaos: {count} prompts, 4 shards ({LATENCY * 1000:.0f} ms each), concurrency {concurrency}, "
        f"attempt timeout {policy.attempt_timeout_seconds:g}s; " + "; ".join(f.describe() for f in chaos.faults)
    )
    print(f"   naive retry-on-same-shard   : {naive.row(count, deadline)}")
    print(f"   Dispatcher                  : {ours.row(count, deadline)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--prompts", type=int, default=50_000, help="prompts for the overhead measurement")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    if args.smoke:
        overhead(500, 16, repeat=1)
        value(200, 16, deadline=3)
    else:
        overhead(args.prompts, args.concurrency, repeat=5)
        value(3000, 32, deadline=10)


if __name__ == "__main__":
    main()
