"""Real aiohttp failures, produced against a real aiohttp server on 127.0.0.1, classify as a trainer needs."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from rollout_runtime.failures import FailureClass, classify_rollout_failure, to_picklable_failure
from support.boundary_workers import VLLM_CONTEXT_LENGTH


@pytest.fixture
async def server() -> AsyncIterator[str]:
    release = asyncio.Event()

    async def disconnect(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b'{"choices": [')
        assert request.transport is not None
        request.transport.close()  # the shard dies mid-response
        return response

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="too late")

    async def status(request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        body = {"object": "error", "message": VLLM_CONTEXT_LENGTH, "type": "BadRequestError", "code": code}
        return web.json_response(body, status=code)

    app = web.Application()
    app.router.add_get("/disconnect", disconnect)
    app.router.add_get("/hang", hang)
    app.router.add_get("/status/{code}", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        release.set()
        await runner.cleanup()


async def failure_of(url: str, **timeout: float) -> BaseException:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(**timeout)) as session:
        with pytest.raises(Exception) as info:
            async with session.get(url) as response:
                response.raise_for_status()
                await response.read()
    return info.value


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_connection_refused_is_infra() -> None:
    exc = await failure_of(f"http://127.0.0.1:{closed_port()}/", total=10)
    assert isinstance(exc, aiohttp.ClientConnectorError)
    assert classify_rollout_failure(exc) is FailureClass.INFRA


async def test_disconnect_mid_response_is_infra(server: str) -> None:
    exc = await failure_of(f"{server}/disconnect", total=10)
    assert isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError)
    assert classify_rollout_failure(exc) is FailureClass.INFRA


async def test_read_timeout_is_infra(server: str) -> None:
    exc = await failure_of(f"{server}/hang", sock_read=0.2)
    assert isinstance(exc, TimeoutError)
    assert classify_rollout_failure(exc) is FailureClass.INFRA


@pytest.mark.parametrize(
    ("code", "expected"), [(400, FailureClass.DATA), (429, FailureClass.INFRA), (503, FailureClass.INFRA)]
)
async def test_http_errors_classify_by_status(server: str, code: int, expected: FailureClass) -> None:
    exc = await failure_of(f"{server}/status/{code}", total=10)
    assert isinstance(exc, aiohttp.ClientResponseError)
    assert exc.status == code
    assert classify_rollout_failure(exc) is expected
    assert classify_rollout_failure(to_picklable_failure(exc)) is expected
