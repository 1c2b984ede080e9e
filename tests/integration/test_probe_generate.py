"""The generate probe against a real sim shard process whose engine is frozen (``engine_hang``): ``/health`` keeps
answering 200 (as vLLM's does), only the 1-token generation tells, and a shard source with ``probe.generate``
takes the shard out while one that trusts ``/health`` keeps it. The same against real vLLM is in tests/vllm."""

from __future__ import annotations

import asyncio

import aiohttp

from rollout_runtime.health import HealthPhase, HttpProber, ProbeReason, ProbeSettings
from rollout_runtime.health.targets import ProbeTargetPolicy
from rollout_runtime.shards import LocalShardSource
from rollout_runtime.sim import SimFleet
from rollout_runtime.sim.process import until

LOOPBACK = ProbeTargetPolicy(allow_loopback=True)
HEALTH = ProbeSettings(period_seconds=0.3, timeout_seconds=0.2, failure_threshold=2, success_threshold=1)
GENERATE = HEALTH.model_copy(update={"generate": True})


async def freeze_engine(endpoint: str) -> None:
    async with aiohttp.ClientSession() as http, http.post(f"{endpoint}/admin/faults", json={"engine_hang": True}) as r:
        assert r.status == 200, await r.text()


async def test_a_frozen_engine_passes_health_and_fails_the_generate_probe() -> None:
    async with SimFleet(1) as fleet, HttpProber(LOOPBACK) as prober:
        shard = fleet.shards[0]
        assert (await prober.probe(shard.endpoint, GENERATE, expected_model=shard.model)).ok
        await freeze_engine(shard.endpoint)
        health = await prober.probe(shard.endpoint, HEALTH, expected_model=shard.model)
        generate = await prober.probe(shard.endpoint, GENERATE, expected_model=shard.model)
    assert health.ok, "the frozen engine's /health and /v1/models still answer"
    assert generate.reason is ProbeReason.TIMEOUT
    assert generate.message == "no generation within 0.2 s"


async def test_only_the_generate_probe_takes_a_frozen_engine_out_of_the_healthy_set() -> None:
    async with SimFleet(2) as fleet:
        frozen, other = fleet.shards
        health_source = LocalShardSource(fleet.shards, HEALTH, policy=LOOPBACK)
        generate_source = LocalShardSource(fleet.shards, GENERATE, policy=LOOPBACK)
        followers = [asyncio.create_task(follow(source)) for source in (health_source, generate_source)]
        try:
            for source in (health_source, generate_source):
                await until(lambda s=source: len(s.current().names()) == 2, timeout_seconds=30, what="both serving")
            await freeze_engine(frozen.endpoint)
            await until(
                lambda: frozen.name not in generate_source.current().names(),
                timeout_seconds=30,
                what="the frozen shard out of the generate-probed set",
            )
            assert generate_source.phases()[frozen.name] is HealthPhase.UNHEALTHY
            assert other.name in generate_source.current().names()
            assert health_source.current().names() == {frozen.name, other.name}, "/health alone keeps it serving"
            assert health_source.phases()[frozen.name] is HealthPhase.HEALTHY
        finally:
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)


async def follow(source: LocalShardSource) -> None:
    async for _ in source.snapshots():
        pass
