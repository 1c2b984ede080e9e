"""Probing that says why: the model check is asked for, not implied; a never-healthy shard says what to fix."""

from __future__ import annotations

import contextlib

import pytest
from aiohttp import web

from rollout_runtime.dispatch import Dispatcher, DispatchPolicy
from rollout_runtime.failures import NoHealthyShards
from rollout_runtime.health import HealthPhase, ProbeSettings
from rollout_runtime.health.targets import ProbeTargetPolicy
from rollout_runtime.shards import LocalShardSource, Shard
from support.deadlines import within
from support.httpserver import serve

PROBE = ProbeSettings(period_seconds=0.2, failure_threshold=1, success_threshold=1)


def server(*paths: str) -> web.Application:
    """A server answering 200 on ``paths`` only (like a harness shard without /v1/models, or one without /health)."""

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    for path in paths:
        app.router.add_get(path, ok)
    return app


def test_a_period_alone_gives_a_timeout_that_fits_it() -> None:
    assert ProbeSettings(period_seconds=1).timeout_seconds == 0.5
    assert ProbeSettings(periodSeconds=30).timeout_seconds == 2.0
    assert ProbeSettings(period_seconds=1, timeout_seconds=0.9).timeout_seconds == 0.9
    with pytest.raises(ValueError, match="timeout_seconds"):
        ProbeSettings(period_seconds=1, timeout_seconds=2)


async def test_a_shard_with_a_model_but_no_models_endpoint_becomes_healthy() -> None:
    async with serve(server("/health")) as url:
        source = LocalShardSource([Shard(name="s", endpoint=url, model="my-model")], PROBE)
        async with Dispatcher(source, DispatchPolicy()) as dispatcher:
            assert await within(dispatcher.wait_ready(1, timeout=30), "a healthy shard") == ("s",)


async def test_asking_for_the_model_check_says_the_endpoint_is_missing() -> None:
    async with serve(server("/health")) as url:
        settings = PROBE.model_copy(update={"check_model": True})
        source = LocalShardSource([Shard(name="s", endpoint=url, model="my-model")], settings)
        async with contextlib.aclosing(source.snapshots()) as snapshots:
            await within(anext(snapshots), "a probe round")
        assert "set probe.check_model to false" in (source.states["s"].last_error or "")


async def test_a_never_healthy_shard_says_why_in_the_error_that_ends_the_wait() -> None:
    async with serve(server("/healthz")) as url:
        source = LocalShardSource([Shard(name="s", endpoint=url)], PROBE, policy=ProbeTargetPolicy.local())
        async with Dispatcher(source, DispatchPolicy()) as dispatcher:
            with pytest.raises(NoHealthyShards) as caught:
                await dispatcher.wait_ready(1, timeout=1.0)
    message = str(caught.value)
    assert "/health answered 404" in message
    assert "set probe.path" in message
    assert source.states["s"].phase is not HealthPhase.HEALTHY
