"""Per-target probe timers and passive liveness against real aiohttp targets on 127.0.0.1.

A blackholed target with the largest timeout the CRD allows does not delay the detection of a killed neighbour;
a busy server whose probes time out while it completes requests stays in the healthy set.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import web

from rollout_runtime.dispatch import Completed, Dispatcher, DispatchPolicy
from rollout_runtime.health import (
    HealthMonitor,
    HealthPhase,
    HttpProber,
    ProbeReason,
    ProbeResult,
    ProbeSettings,
    ProbeTarget,
    ProbeTargetPolicy,
    Transition,
)
from rollout_runtime.shards import LocalShardSource, Shard
from support.httpserver import blackhole, serve

GUARD_SECONDS = 60  # a hang guard, not a timing assertion
MODEL = "m"
BLACKHOLE = ProbeSettings(period_seconds=3600, timeout_seconds=3599, failure_threshold=3, success_threshold=1)
FAST = ProbeSettings(period_seconds=0.5, timeout_seconds=0.4, failure_threshold=2, success_threshold=1)
MODEL_CHECKED = FAST.model_copy(update={"check_model": True})
"""FAST, probing ``/v1/models`` too (the check a busy llama.cpp-style server answers only when idle)."""


class RecordingProber:
    """The real HttpProber, recording every probe it started and every result, by endpoint."""

    def __init__(self, inner: HttpProber) -> None:
        self.inner = inner
        self.started: list[str] = []
        self.results: list[tuple[str, ProbeResult]] = []

    async def probe(self, endpoint: str, settings: ProbeSettings, *, expected_model: str | None = None) -> ProbeResult:
        self.started.append(endpoint)
        result = await self.inner.probe(endpoint, settings, expected_model=expected_model)
        self.results.append((endpoint, result))
        return result

    def reasons(self, endpoint: str) -> list[ProbeReason]:
        return [r.reason for e, r in self.results if e == endpoint]


def models_app(models_lock: asyncio.Lock | None = None, hold_seconds: float = 0.0) -> web.Application:
    """An OpenAI-ish shard: /health, /v1/models (waits on the model lock, like llama.cpp), POST /generate."""

    async def health(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def list_models(request: web.Request) -> web.StreamResponse:
        if models_lock is not None:
            async with models_lock:
                pass
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def generate(request: web.Request) -> web.StreamResponse:
        assert models_lock is not None
        async with models_lock:
            await asyncio.sleep(hold_seconds)  # the model is busy generating: the server under load, not a sync
        return web.json_response({"text": "done"})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/generate", generate)
    return app


async def test_a_blackholed_target_does_not_delay_a_killed_targets_detection() -> None:
    async with (
        blackhole() as (hole_url, hole_hits),
        HttpProber(ProbeTargetPolicy.local()) as http,
        asyncio.timeout(GUARD_SECONDS),
    ):
        prober = RecordingProber(http)
        killed = contextlib.AsyncExitStack()
        shard_url = await killed.enter_async_context(serve(models_app()))
        monitor = HealthMonitor(
            [ProbeTarget("hole", hole_url, BLACKHOLE, MODEL), ProbeTarget("shard", shard_url, FAST, MODEL)], prober
        )
        async with contextlib.aclosing(monitor.rounds()) as rounds:
            async for _ in rounds:
                if prober.started.count(shard_url) >= 3 and monitor.states["shard"].serving:
                    break
            await killed.aclose()  # the shard's process is gone: connections are refused from here on
            probes_before_kill = prober.started.count(shard_url)
            async for _ in rounds:
                if monitor.states["shard"].phase is HealthPhase.UNHEALTHY:
                    break
            probes_after_kill = prober.started.count(shard_url) - probes_before_kill
            assert hole_hits == ["/health"], "the blackhole's first probe was pending the whole time"
            assert prober.reasons(hole_url) == []
        # The killed shard kept its own period: it needed its failure threshold of refused probes and no more
        # (one probe may have been in flight when it died), not a wait for the blackhole's 3599 s deadline.
        assert probes_after_kill <= FAST.failure_threshold + 1
        assert prober.reasons(shard_url)[-FAST.failure_threshold :] == [ProbeReason.CONNECT] * FAST.failure_threshold


async def test_a_busy_shard_whose_probes_time_out_while_requests_complete_stays_in_the_healthy_set() -> None:
    """Six requests queue on the model lock, each holding it 0.2 s, so a /v1/models probe waits about a second
    behind them and times out (0.4 s); the requests keep completing, so the shard keeps serving."""
    models_lock = asyncio.Lock()
    transitions: list[Transition] = []
    async with serve(models_app(models_lock, hold_seconds=0.2)) as url, asyncio.timeout(GUARD_SECONDS):
        shard = Shard(name="busy", endpoint=url, model=MODEL)
        prober = RecordingProber(HttpProber(ProbeTargetPolicy.local()))
        source = LocalShardSource(
            [shard], MODEL_CHECKED, prober=prober, on_transition=lambda name, t, result: transitions.append(t)
        )
        async with aiohttp.ClientSession() as session:

            async def rollout(target: Shard, prompt: int) -> str:
                async with session.post(target.endpoint + "/generate", json={"prompt": prompt}) as response:
                    response.raise_for_status()
                    return str((await response.json())["text"])

            policy = DispatchPolicy(max_concurrency=6, healthy_wait_seconds=GUARD_SECONDS)
            async with Dispatcher(source, policy) as dispatcher:
                outcomes = [outcome async for outcome in dispatcher.run(range(30), rollout)]
        await prober.inner.close()
    assert all(isinstance(outcome, Completed) for outcome in outcomes)
    reasons = prober.reasons(url)
    streak = max(len(run) for run in "".join("t" if r is ProbeReason.TIMEOUT else "." for r in reasons).split("."))
    assert streak >= MODEL_CHECKED.failure_threshold, f"the probes must have timed out enough to matter: {reasons}"
    assert all(t.to_phase.serving for t in transitions[1:]), transitions  # after Pending -> Healthy, never out
    assert transitions[0].to_phase is HealthPhase.HEALTHY
