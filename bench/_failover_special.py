"""The failover benchmark's scenarios that are not a fault matrix: weights (restarts plus refits: stale results
committed) and the blame scenarios of issue 13 (poison prompt, fleet-wide 401, no shards at all). Each has its own
driver and table; bench/failover.py runs them with ``--weights`` and ``--scenario poison|fleet-401|no-shards``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from failover_scenarios import Scale
from rollout_runtime.dispatch import AttemptEnded, Completed, Dispatcher, DispatchEvent, DispatchPolicy
from rollout_runtime.failures import RolloutFailure
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim import SimFleet, expected_answer

Prompt = tuple[int, str]


WEIGHTS = Scale(6, 32, 30.0, 0.2, 10.0, 0.5, 0.25, 0.1, 2.0)
WEIGHTS_SMOKE = Scale(5, 8, 3.0, 0.05, 1.5, 0.25, 0.15, 0.05, 0.5)
"""The weights scenario's sizes (4,800 and 480 prompts), kept from before the matrix so its figures still compare."""


def weights_prompts(scale: Scale) -> int:
    return int(scale.duration * scale.concurrency / scale.latency)


def arithmetic_prompts(count: int, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    return [(i, f"What is {rng.randint(2, 999)} {rng.choice('+-*')} {rng.randint(2, 999)}?") for i in range(count)]


# -- scenario: weights (restarts plus a refit every N seconds) ---------------------------------------------------


@dataclass
class WeightsRow:
    mode: str
    committed: int
    stale_committed: int
    stale_attempts: int
    wall: float

    @property
    def goodput(self) -> float:
        """On-policy results committed per second."""
        return (self.committed - self.stale_committed) / self.wall


class _Untracked:
    """Today's behaviour: no policy version, so every answer commits (a WeightsView that knows nothing)."""

    policy_version = None

    def version_of(self, shard: str) -> None:
        return None

    def stale_shards(self) -> dict[str, bool]:
        return {}


async def drive_weights(aware: bool, scale: Scale, seed: int, refit_every: float, restart_every: float) -> WeightsRow:
    """One fleet, one trainer loop (publish v+1 and refit every shard every ``refit_every`` s with SGLang's
    ``update_weights_from_disk``) and a shard restarted every ``restart_every`` s (it comes back at base weights).
    ``aware``: the dispatcher follows the WeightsTracker (Stale until refit, max_weights_lag 0); otherwise today's
    behaviour, the same updates sent with no version check. A committed result is stale when the version it was
    produced at (the shard's ``X-Weight-Version``, read when the request started) is not the trainer's version at
    the moment the dispatcher committed it."""
    from rollout_runtime.sim import SimFaults
    from rollout_runtime.weights import SGLangWeightVersion

    slow = SimFaults(slow_seconds=scale.latency)
    names = [f"shard-{i}" for i in range(scale.shards)]
    prompts = arithmetic_prompts(weights_prompts(scale), seed)
    async with SimFleet(scale.shards, faults=dict.fromkeys(names, slow), seed=seed) as fleet:
        import aiohttp

        identity = SGLangWeightVersion() if aware else None
        source = LocalShardSource(fleet.shards, scale.probe(), identity=identity)
        policy = scale.policy(len(prompts))
        weights = None if aware else _Untracked()  # None: the source's WeightsTracker
        current = {"version": 0}
        policy_at_commit: dict[int, int] = {}

        def observe(event: DispatchEvent) -> None:
            # Emitted synchronously where the dispatcher decides to commit: the trainer's version at that moment.
            if isinstance(event, AttemptEnded) and event.outcome == "success":
                policy_at_commit[int(event.prompt_id)] = current["version"]

        dispatcher = Dispatcher(
            source, policy, seed=seed, registry=CollectorRegistry(), weights=weights, observer=observe
        )
        stale_committed = 0
        async with aiohttp.ClientSession() as http, dispatcher:

            async def update(name: str, version: int) -> None:
                body = {"model_path": f"/ckpt/step-{version}", "weight_version": str(version)}
                async with http.post(f"{fleet.shard(name).endpoint}/update_weights_from_disk", json=body) as r:
                    if r.status != 200:
                        raise RuntimeError(f"update of {name} answered {r.status}")

            async def refit(version: int) -> None:
                current["version"] = version  # the trainer's policy from here on, whatever the shards hold
                if aware:
                    await source.weights.publish(version)
                    await source.weights.refit_all(version, lambda name: update(name, version))
                else:
                    await asyncio.gather(*(update(name, version) for name in names), return_exceptions=True)

            async def trainer() -> None:
                version, restarted = 0, 0
                loop = asyncio.get_running_loop()
                next_refit, next_restart = loop.time() + refit_every, loop.time() + restart_every
                while True:
                    await asyncio.sleep(max(0.0, min(next_refit, next_restart) - loop.time()))
                    if loop.time() >= next_restart:
                        await fleet.restart(names[restarted % len(names)], faults=slow)
                        restarted += 1
                        next_restart += restart_every
                    if loop.time() >= next_refit:
                        version += 1
                        await refit(version)
                        next_refit += refit_every

            async def rollout(shard: Shard, prompt: Prompt) -> str:
                body = {"model": "sim-model", "prompt": prompt[1], "max_tokens": 16}
                async with http.post(f"{shard.endpoint}/v1/completions", json=body) as response:
                    response.raise_for_status()
                    payload = await response.json()
                    version = response.headers["X-Weight-Version"]
                if aware:
                    await source.weights.observe(shard.name, f"weight_version:{version}")
                return f"{version}|{payload['choices'][0]['text']}"

            await refit(1)
            started = time.monotonic()
            train = asyncio.create_task(trainer())
            run = dispatcher.run(prompts, rollout, prompt_ids=[pid for pid, _ in prompts])
            committed = 0
            try:
                async for outcome in run:
                    if isinstance(outcome, Completed):
                        committed += 1
                        produced_at = outcome.result.split("|", 1)[0]
                        if produced_at != str(policy_at_commit[int(outcome.prompt_id)]):
                            stale_committed += 1
            finally:
                train.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await train
            wall = time.monotonic() - started
            return WeightsRow(
                "weights-aware" if aware else "weights-unaware", committed, stale_committed, run.stats.stale, wall
            )


async def weights_scenario(scale: Scale, seed: int, refit_every: float, restart_every: float) -> list[WeightsRow]:
    """Both modes on the same schedule, one after the other in one run; prints the table."""
    print(
        f"weights benchmark: {scale.shards} sim shards, {weights_prompts(scale)} prompts, "
        f"{scale.concurrency} concurrent, "
        f"{scale.latency:g}s generation, a refit every {refit_every:g}s, a restart every {restart_every:g}s,"
        f" seed {seed}"
    )
    rows = [await drive_weights(aware, scale, seed, refit_every, restart_every) for aware in (True, False)]
    print(f"{'mode':<18}{'committed':>10}{'stale committed':>17}{'stale attempts':>16}{'wall s':>8}{'goodput/s':>11}")
    for row in rows:
        print(
            f"{row.mode:<18}{row.committed:>10}{row.stale_committed:>17}{row.stale_attempts:>16}"
            f"{row.wall:>8.1f}{row.goodput:>11.1f}"
        )
    return rows


# -- blame scenarios (issue 13): in-process aiohttp shards on 127.0.0.1, no chaos ----------------------------------

POISON_TEXT = "the prompt every shard answers 500"


async def _blame_fleet(count: int, status_for: Callable[[str], int]) -> tuple[list[Shard], Callable[[], int], Any]:
    """``count`` real aiohttp servers answering a completion, or ``status_for(prompt)`` when that is not 200."""
    from contextlib import AsyncExitStack

    from aiohttp import web

    answered = [0]
    stack = AsyncExitStack()

    async def route(request: web.Request) -> web.StreamResponse:
        answered[0] += 1
        prompt = (await request.json()).get("prompt", "")
        status = status_for(prompt)
        if status != 200:
            return web.json_response({"error": {"message": f"refused ({status})"}}, status=status)
        return web.json_response({"choices": [{"text": expected_answer(prompt), "finish_reason": "stop"}]})

    shards = []
    for index in range(count):
        app = web.Application()
        app.router.add_post("/v1/completions", route)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        stack.push_async_callback(runner.cleanup)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        shards.append(Shard(name=f"shard-{index}", endpoint=f"http://127.0.0.1:{port}"))
    return shards, lambda: answered[0], stack


async def scenario_poison(seed: int) -> None:
    """A poison prompt (500 on every shard, as llama.cpp answers a malformed request) among 4,800."""
    from rollout_runtime.shards import StaticShardSource

    shards, answered, stack = await _blame_fleet(6, lambda p: 500 if p == POISON_TEXT else 200)
    prompts = [f"prompt {i}" for i in range(4800)]
    prompts[2400] = POISON_TEXT
    # One prompt may be data-failed (max_skipped_prompts: the poison one); the default 0 would end the run on it.
    policy = DispatchPolicy(
        max_concurrency=32, backoff_initial_seconds=0.1, backoff_max_seconds=2.0, max_skipped_prompts=1
    )
    started = time.monotonic()
    error: BaseException | None = None
    results: dict[str, int] = {}
    async with stack, GenerationClient() as client, Dispatcher(StaticShardSource(shards), policy, seed=seed) as d:

        async def rollout(shard: Shard, prompt: str) -> str:
            return (await client.complete(shard, prompt, max_tokens=16)).text

        run = d.run(prompts, rollout)
        try:
            async for outcome in run:
                results[type(outcome).__name__] = results.get(type(outcome).__name__, 0) + 1
        except Exception as exc:
            error = exc
    print(
        f"poison prompt among {len(prompts)} on {len(shards)} shards: outcomes {results}, run error "
        f"{type(error).__name__ if error else 'none'}, healthy shards ejected {run.stats.ejections}, attempts "
        f"{run.stats.attempts} ({answered()} answered), {time.monotonic() - started:.1f}s"
    )


async def scenario_fleet_401(seed: int) -> None:
    """Every shard answers 401: attempts until the run-level error, against a naive loop over the same fleet."""
    from rollout_runtime.shards import StaticShardSource

    shards, answered, stack = await _blame_fleet(6, lambda p: 401)
    prompts = [f"prompt {i}" for i in range(200)]
    policy = DispatchPolicy(max_concurrency=32, backoff_initial_seconds=0.1, backoff_max_seconds=2.0)
    error: BaseException | None = None
    async with stack, GenerationClient() as client:
        async with Dispatcher(StaticShardSource(shards), policy, seed=seed) as d:

            async def rollout(shard: Shard, prompt: str) -> str:
                return (await client.complete(shard, prompt, max_tokens=16)).text

            run = d.run(prompts, rollout)
            try:
                async for _ in run:
                    pass
            except Exception as exc:
                error = exc
        ours = run.stats.infra_failures + run.stats.data_failures
        before_naive = answered()
        failed = 0
        for index, prompt in enumerate(prompts):  # naive: each prompt on its shard, a 401 retried as infra
            for attempt in range(1, policy.max_infra_attempts + 1):
                try:
                    await client.complete(shards[index % len(shards)], prompt, max_tokens=16)
                    break
                except RolloutFailure:
                    if attempt == policy.max_infra_attempts:
                        failed += 1
        naive = answered() - before_naive
    print(
        f"fleet-wide 401 on {len(shards)} shards, {len(prompts)} prompts: rollout-fleet ended after {ours} failed "
        f"attempts (bound 2 x shards = {2 * len(shards)}) with {type(error).__name__ if error else 'no error'}: "
        f"{error}; naive loop: {naive} attempts, {failed} prompts failed, no run-level error"
    )


def scenario_no_shards(seed: int) -> None:
    """100,000 prompts with zero healthy shards: seconds until the run raises, and the process's peak RSS."""
    import resource

    from rollout_runtime.shards import StaticShardSource

    async def go() -> tuple[float, str]:
        policy = DispatchPolicy(healthy_wait_seconds=1.0, backoff_initial_seconds=0.0, backoff_max_seconds=0.0)
        started = time.monotonic()
        async with Dispatcher(StaticShardSource([]), policy, seed=seed) as d:

            async def rollout(shard: Shard, prompt: int) -> int:
                return prompt

            try:
                async for _ in d.run(range(100_000), rollout):
                    pass
            except Exception as exc:
                return time.monotonic() - started, f"{type(exc).__name__}: {exc}"[:120]
        return time.monotonic() - started, "no error"

    seconds, error = asyncio.run(go())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"100,000 prompts, zero healthy shards (healthy wait 1 s): {seconds:.1f}s to {error}; peak RSS {peak_mb:.0f} MB"
    )


BLAME: dict[str, Callable[[int], Any]] = {
    "poison": lambda seed: asyncio.run(scenario_poison(seed)),
    "fleet-401": lambda seed: asyncio.run(scenario_fleet_401(seed)),
    "no-shards": scenario_no_shards,
}
