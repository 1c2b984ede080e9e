"""The HTTP prober against real aiohttp servers on 127.0.0.1: every failure becomes a labelled result."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.abc import ResolveResult
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_runtime.health import HttpProber, ProbeReason, ProbeSettings, ProbeTargetPolicy
from rollout_runtime.health import probe as probe_module
from support.httpserver import refused_url, serve

FAST = ProbeSettings(period_seconds=1.0, timeout_seconds=0.5)
MODEL = "qwen-0.5b"


def models_body(*ids: str) -> dict[str, object]:
    return {"object": "list", "data": [{"id": i, "object": "model", "owned_by": "vllm"} for i in ids]}


def shard_app(
    *,
    health_status: int = 200,
    models: object = None,
    models_raw: bytes | None = None,
    hits: list[str] | None = None,
) -> web.Application:
    seen = hits if hits is not None else []

    async def health(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        return web.Response(status=health_status)

    async def list_models(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        if models_raw is not None:
            return web.Response(body=models_raw, content_type="application/json")
        return web.json_response(models if models is not None else models_body(MODEL))

    async def elsewhere(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        return web.Response(text="you should not be here")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/elsewhere", elsewhere)
    return app


@pytest.fixture
async def prober() -> AsyncIterator[HttpProber]:
    async with HttpProber(ProbeTargetPolicy.local()) as prober:
        yield prober


async def test_healthy_shard_serving_the_expected_model_passes(prober: HttpProber) -> None:
    async with serve(shard_app()) as url:
        result = await prober.probe(url, FAST, expected_model=MODEL)
    assert result.ok
    assert result.status == 200
    assert result.at > 0


async def test_the_model_list_is_checked_only_when_a_model_is_expected(prober: HttpProber) -> None:
    async with serve(shard_app(models=models_body("other"))) as url:
        ok = await prober.probe(url, FAST, expected_model=None)
        wrong = await prober.probe(url, FAST, expected_model=MODEL)
    assert ok.ok  # no model named: health only
    assert wrong.reason is ProbeReason.WRONG_MODEL


async def test_environment_server_is_probed_on_the_health_path_only(prober: HttpProber) -> None:
    hits: list[str] = []
    async with serve(shard_app(hits=hits)) as url:
        result = await prober.probe(url, FAST)
    assert result.ok
    assert hits == ["/health"]


async def test_server_error_fails_with_status(prober: HttpProber) -> None:
    async with serve(shard_app(health_status=500)) as url:
        result = await prober.probe(url, FAST, expected_model=MODEL)
    assert (result.ok, result.reason, result.status) == (False, ProbeReason.STATUS, 500)
    assert "500" in result.message


async def test_hung_server_fails_with_timeout(prober: HttpProber) -> None:
    never = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        await never.wait()
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", hang)
    async with serve(app) as url:
        result = await prober.probe(url, FAST)
    assert result.reason is ProbeReason.TIMEOUT
    assert "0.5 s" in result.message


async def test_redirect_is_a_failure_and_is_not_followed(prober: HttpProber) -> None:
    hits: list[str] = []

    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/elsewhere")

    app = shard_app(hits=hits)
    app.router.add_get("/moved", redirect)
    async with serve(app) as url:
        result = await prober.probe(url, ProbeSettings(path="/moved", period_seconds=1, timeout_seconds=0.5))
    assert (result.reason, result.status) == (ProbeReason.REDIRECT, 302)
    assert "/elsewhere" in result.message
    assert hits == []


@pytest.mark.parametrize("chunked", [False, True])
async def test_oversized_body_fails_without_reading_it_all(prober: HttpProber, chunked: bool) -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        if not chunked:
            return web.Response(body=b"x" * (1 << 20))
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(64):
            await response.write(b"x" * 16384)
        return response

    app = web.Application()
    app.router.add_get("/health", huge)
    async with serve(app) as url:
        result = await prober.probe(url, FAST)
    assert result.reason is ProbeReason.TOO_LARGE
    assert "65536" in result.message


async def test_malformed_models_json_fails_as_malformed(prober: HttpProber) -> None:
    async with serve(shard_app(models_raw=b'{"data": [')) as url:
        result = await prober.probe(url, FAST, expected_model=MODEL)
    assert result.reason is ProbeReason.MALFORMED


async def test_wrong_model_names_both_models(prober: HttpProber) -> None:
    async with serve(shard_app(models=models_body("llama-3-8b"))) as url:
        result = await prober.probe(url, FAST, expected_model=MODEL)
    assert result.reason is ProbeReason.WRONG_MODEL
    assert MODEL in result.message
    assert "llama-3-8b" in result.message


async def test_connection_refused_fails_with_connect(prober: HttpProber) -> None:
    result = await prober.probe(refused_url(), FAST)
    assert result.reason is ProbeReason.CONNECT


async def test_connection_dropped_mid_response_fails_with_connect(prober: HttpProber) -> None:
    async def drop(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b"partial")
        assert request.transport is not None
        request.transport.close()
        return response

    app = web.Application()
    app.router.add_get("/health", drop)
    async with serve(app) as url:
        result = await prober.probe(url, FAST)
    assert result.reason is ProbeReason.CONNECT


async def test_forbidden_target_is_refused_before_connecting() -> None:
    hits: list[str] = []
    async with serve(shard_app(hits=hits)) as url, HttpProber() as strict:
        result = await strict.probe(url, FAST)
    assert result.reason is ProbeReason.FORBIDDEN_TARGET
    assert "loopback" in result.message
    assert hits == []


async def test_a_name_resolving_to_a_metadata_address_is_refused_at_connect_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class MetadataResolver:
        async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
            return [ResolveResult(hostname=host, host="169.254.169.254", port=port, family=family, proto=0, flags=0)]

        async def close(self) -> None:
            pass

    monkeypatch.setattr(probe_module.aiohttp, "ThreadedResolver", MetadataResolver)
    async with HttpProber(ProbeTargetPolicy(allowed_hosts=("*.example",))) as prober:
        result = await prober.probe("http://innocent.example", FAST)
    assert result.reason is ProbeReason.FORBIDDEN_TARGET
    assert "169.254.169.254" in result.message


async def test_one_session_serves_many_probes(prober: HttpProber) -> None:
    async with serve(shard_app()) as url:
        results = [await prober.probe(url, FAST, expected_model=MODEL) for _ in range(3)]
    assert all(r.ok for r in results)
    assert prober._session is not None
    await prober.close()
    assert prober._session is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=json_values | st.fixed_dictionaries({"data": st.lists(json_values, max_size=4)}))
async def test_any_json_from_models_gives_a_labelled_verdict(prober: HttpProber, payload: object) -> None:
    """Invariant: whatever JSON /v1/models returns, the probe returns ok only if the expected model is listed,
    and otherwise fails as malformed or wrong_model; it never raises."""
    async with serve(shard_app(models_raw=json.dumps(payload).encode())) as url:
        result = await prober.probe(url, FAST, expected_model=MODEL)
    assert result.reason in (ProbeReason.MALFORMED, ProbeReason.WRONG_MODEL)
