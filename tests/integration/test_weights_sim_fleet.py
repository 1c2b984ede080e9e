"""Weights-aware dispatch against real simulated shards (subprocesses on 127.0.0.1) restarted mid-run.

A restarted sim shard comes back at weights version "default" (SGLang's behaviour); the trainer refits through
``WeightsTracker`` with SGLang's ``POST /update_weights_from_disk``. Every answer carries the version it was
produced at (``X-Weight-Version``), so the tests check what was committed against the shard's own word, not the
tracker's belief. Waiting is on transitions (the source's callback) and on completions, never on sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from rollout_runtime.dispatch import AttemptEnded, Completed, Dispatcher, DispatchEvent, DispatchPolicy, DispatchRun
from rollout_runtime.health import HealthPhase, ProbeResult, ProbeSettings, Transition
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim import SimFaults, SimFleet, expected_answer
from rollout_runtime.weights import SGLangWeightVersion
from support.deadlines import within
from support.dispatch import assert_accounted, collect

PROBES = ProbeSettings(period_seconds=0.3, timeout_seconds=0.25, failure_threshold=2, success_threshold=1)
POLICY = DispatchPolicy(
    backoff_initial_seconds=0.05, backoff_max_seconds=0.5, healthy_wait_seconds=60, max_concurrency=6
)
SLOW = SimFaults(slow_seconds=0.05)


@dataclass
class Watch:
    """Phase transitions and completions, as events the test can await."""

    phases: dict[tuple[str, HealthPhase], asyncio.Event] = field(default_factory=dict)
    successes: dict[str, int] = field(default_factory=dict)
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def reached(self, name: str, phase: HealthPhase) -> asyncio.Event:
        return self.phases.setdefault((name, phase), asyncio.Event())

    def on_transition(self, name: str, transition: Transition, result: ProbeResult | None) -> None:
        self.reached(name, transition.to_phase).set()

    def observe(self, event: DispatchEvent) -> None:
        if isinstance(event, AttemptEnded) and event.outcome == "success" and event.shard is not None:
            self.successes[event.shard] = self.successes.get(event.shard, 0) + 1
            self.progress.set()

    async def completions(self, total: int) -> None:
        while sum(self.successes.values()) < total:
            self.progress.clear()
            await self.progress.wait()


@dataclass
class Harness:
    fleet: SimFleet
    source: LocalShardSource
    dispatcher: Dispatcher
    http: aiohttp.ClientSession
    watch: Watch
    answered: list[tuple[str, str]] = field(default_factory=list)
    """(shard, X-Weight-Version) of every answer the rollout got, committed or not."""

    async def rollout(self, shard: Shard, prompt: str) -> tuple[str, str]:
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": 8}
        async with self.http.post(f"{shard.endpoint}/v1/completions", json=body) as response:
            response.raise_for_status()
            payload = await response.json()
            version = response.headers["X-Weight-Version"]
        self.answered.append((shard.name, version))
        # The answer's own version is restart evidence (SGLang stamps every response): feed it before returning,
        # so an answer from a restarted shard is judged stale at once, not after the next identity poll.
        await self.source.weights.observe(shard.name, f"weight_version:{version}")
        return payload["choices"][0]["text"], version

    async def update(self, name: str, version: int, *, path: str = "/ckpt/step") -> None:
        url = f"{self.fleet.shard(name).endpoint}/update_weights_from_disk"
        body = {"model_path": f"{path}-{version}", "weight_version": str(version)}
        async with self.http.post(url, json=body) as response:
            answer = await response.json()
            if response.status != 200 or not answer.get("success"):
                raise RuntimeError(f"update_weights_from_disk on {name}: {answer.get('message')}")

    async def refit_all(self, version: int) -> dict[str, BaseException]:
        await self.source.weights.publish(version)
        return await self.source.weights.refit_all(version, lambda name: self.update(name, version))

    async def run(self, count: int) -> tuple[DispatchRun[str, tuple[str, str]], list[Any]]:
        run = self.dispatcher.run([f"What is {i} + 1?" for i in range(count)], self.rollout)
        return run, await within(collect(run), f"a run of {count} prompts")


@contextlib.asynccontextmanager
async def harness(count: int = 3) -> AsyncIterator[Harness]:
    watch = Watch()
    faults = {f"shard-{i}": SLOW for i in range(count)}
    async with SimFleet(count, faults=faults) as fleet, aiohttp.ClientSession() as http:
        source = LocalShardSource(
            fleet.shards, PROBES, identity=SGLangWeightVersion(), on_transition=watch.on_transition
        )
        async with Dispatcher(source, POLICY, observer=watch.observe, seed=0) as dispatcher:
            yield Harness(fleet, source, dispatcher, http, watch)


def committed_versions(outcomes: list[Any]) -> set[str]:
    return {o.result[1] for o in outcomes if isinstance(o, Completed)}


def assert_results_correct(outcomes: list[Any]) -> None:
    for outcome in outcomes:
        if isinstance(outcome, Completed):
            assert outcome.result[0].strip() == expected_answer(outcome.prompt), outcome


async def test_a_restarted_shard_is_stale_commits_nothing_and_serves_again_after_refit() -> None:
    async with harness() as h:
        assert await h.refit_all(1) == {}
        assert h.source.weights.versions() == {"shard-0": 1, "shard-1": 1, "shard-2": 1}

        async def restart_shard_0() -> None:
            await h.watch.completions(10)
            await h.fleet.restart("shard-0", faults=SLOW)

        run = h.dispatcher.run([f"What is {i} + 1?" for i in range(150)], h.rollout)
        chaos = asyncio.create_task(restart_shard_0())
        outcomes = await within(collect(run), "the run across the restart")
        await within(chaos, "the restart")
        await within(h.watch.reached("shard-0", HealthPhase.STALE).wait(), "shard-0 to go Stale after its restart")

        assert_accounted(run, outcomes, range(150))
        assert_results_correct(outcomes)
        assert committed_versions(outcomes) == {"1"}, "a result from base weights was committed"
        assert all(isinstance(o, Completed) and o.weights_version == 1 for o in outcomes)
        assert run.stats.committed_by_version == {1: 150}
        assert h.source.states["shard-0"].phase is HealthPhase.STALE
        async with h.http.get(f"{h.fleet.shard('shard-0').endpoint}/weight_version") as response:
            assert (await response.json())["weight_version"] == "default", "the restart did not reset the weights"

        # While Stale, the dispatcher routes nothing to it.
        before = len(h.answered)
        run2, outcomes2 = await h.run(30)
        assert_accounted(run2, outcomes2, range(30))
        assert "shard-0" not in {name for name, _ in h.answered[before:]}
        assert "shard-0" not in h.dispatcher.routable

        # The trainer's refit brings it back, at the current version.
        async with h.source.weights.refit("shard-0", 1):
            await h.update("shard-0", 1)
        assert h.source.states["shard-0"].weights_version == 1
        await within(h.watch.reached("shard-0", HealthPhase.HEALTHY).wait(), "shard-0 back to Healthy")
        served = h.watch.successes.get("shard-0", 0)
        run3, outcomes3 = await h.run(60)
        assert_accounted(run3, outcomes3, range(60))
        assert h.watch.successes.get("shard-0", 0) > served, "traffic did not return to the refit shard"
        assert committed_versions(outcomes3) == {"1"}
        assert h.dispatcher.metrics.value("rollout_committed_results_total", {"lag": "0"}) == 240


async def test_a_failed_refit_leaves_the_shard_stale_and_out_of_traffic() -> None:
    async with harness(2) as h:
        assert await h.refit_all(1) == {}
        await h.source.weights.publish(2)
        with pytest.raises(RuntimeError, match="failed to load weights"):
            async with h.source.weights.refit("shard-1", 2):
                await h.update("shard-1", 2, path="/nonexistent/step")
        assert h.source.states["shard-1"].phase is HealthPhase.STALE
        assert h.source.states["shard-1"].weights_version is None
        assert (await h.fleet.stats("shard-1")).get("refits_failed") == 1
        async with h.source.weights.refit("shard-0", 2):
            await h.update("shard-0", 2)
        before = len(h.answered)
        run, outcomes = await h.run(20)
        assert_accounted(run, outcomes, range(20))
        assert {name for name, _ in h.answered[before:]} == {"shard-0"}
        assert committed_versions(outcomes) == {"2"}
        assert h.dispatcher.metrics.value("rollout_shard_stale", {"shard": "shard-1"}) == 1
        assert h.dispatcher.metrics.value("rollout_stale_shards") == 1


async def test_concurrent_refits_of_several_shards_record_each_version_and_isolate_a_failure() -> None:
    async with harness(3) as h:
        await h.source.weights.publish(4)

        async def update(name: str) -> None:
            await h.update(name, 4, path="/nonexistent/step" if name == "shard-2" else "/ckpt/step")

        failures = await h.source.weights.refit_all(4, update)
        assert set(failures) == {"shard-2"}
        assert h.source.weights.versions() == {"shard-0": 4, "shard-1": 4, "shard-2": None}
        for name in ("shard-0", "shard-1"):
            async with h.http.get(f"{h.fleet.shard(name).endpoint}/get_weight_version") as response:
                assert (await response.json())["weight_version"] == "4"
        run, outcomes = await h.run(30)
        assert_accounted(run, outcomes, range(30))
        assert committed_versions(outcomes) == {"4"}
        assert "shard-2" not in {name for name, _ in h.answered}
