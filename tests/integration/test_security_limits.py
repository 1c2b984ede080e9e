"""Limits that keep a server up for everyone: request size, slow clients, episode concurrency, no stack traces.

The servers are the real subprocesses (``rollout-fleet sim-env`` and ``rollout-fleet sim-shard``) on 127.0.0.1.
Slowloris-style clients hold connections open with half-sent headers or bodies; oversized bodies are declared or
streamed past the limit. Meanwhile an ordinary client must keep getting answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from rollout_runtime.environment import (
    EnvironmentClient,
    EnvironmentServerConfig,
    setup_environment_app,
)
from rollout_runtime.failures import RolloutInfraFailure, RolloutTerminalDataFailure
from rollout_runtime.sim import SimFleet
from rollout_runtime.sim.env_process import SimEnvProcess, spawn_env_server
from rollout_runtime.sim.environments import MultiStepRequest, MultiStepResponse
from support.environment import ProbeRequest, ProbeServer

SLOW_CLIENTS = 64
MIB = 1024 * 1024
TRACE_MARKERS = ("Traceback", 'File "', "site-packages")


async def _slow_clients(port: int, path: str) -> list[asyncio.StreamWriter]:
    """Open connections that send part of a request and then nothing: half the headers, or headers and a
    sliver of a promised body."""
    writers = []
    for index in range(SLOW_CLIENTS):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        if index % 2:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-".encode())
        else:
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f'Content-Length: 100000\r\n\r\n{{"episode'.encode()
            )
        await writer.drain()
        writers.append(writer)
    return writers


async def _close(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()
    for writer in writers:
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _chunks(total: int) -> AsyncIterator[bytes]:
    chunk = b"[" + b"1," * (64 * 1024) + b"1]"
    sent = 0
    while sent < total:
        yield chunk
        sent += len(chunk)


def _no_trace(text: str) -> None:
    for marker in TRACE_MARKERS:
        assert marker not in text, text[:300]


@pytest.fixture
async def env_server(tmp_path: Path) -> AsyncIterator[SimEnvProcess]:
    async with await spawn_env_server("verifier", log_path=tmp_path / "env.log") as process:
        yield process


@pytest.fixture
async def shard_fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(1) as fleet:
        yield fleet


async def _keeps_serving(
    session: aiohttp.ClientSession, port: int, path: str, ordinary: Callable[[], Awaitable[None]]
) -> None:
    writers = await _slow_clients(port, path)
    try:
        for _ in range(20):
            await ordinary()
        url = f"http://127.0.0.1:{port}{path}"
        async with session.post(
            url, data=io.BytesIO(b"x" * (2 * MIB)), headers={"Content-Type": "application/json"}
        ) as response:
            assert response.status == 413
            _no_trace(await response.text())
        async with session.post(url, data=_chunks(3 * MIB), headers={"Content-Type": "application/json"}) as response:
            assert response.status == 413
            _no_trace(await response.text())
    finally:
        await _close(writers)
    await ordinary()


async def test_the_environment_server_serves_others_while_slow_and_oversized_clients_hang_on(
    env_server: SimEnvProcess,
) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def ordinary() -> None:
            async with session.post(f"{env_server.url}/run", json={"problem": "6 * 7", "answer": "42"}) as response:
                assert response.status == 200
                assert (await response.json())["reward"] == 1.0

        await _keeps_serving(session, env_server.port, "/run", ordinary)


async def test_the_simulated_shard_serves_others_while_slow_and_oversized_clients_hang_on(
    shard_fleet: SimFleet,
) -> None:
    shard = shard_fleet.shards[0]
    port = int(shard.endpoint.rsplit(":", 1)[1])
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def ordinary() -> None:
            async with session.post(f"{shard.endpoint}/v1/completions", json={"prompt": "What is 6 * 7?"}) as response:
                assert response.status == 200
                assert (await response.json())["choices"][0]["text"] == "42"

        await _keeps_serving(session, port, "/v1/completions", ordinary)


async def test_episode_concurrency_is_capped_and_the_overflow_is_refused_as_retryable(tmp_path: Path) -> None:
    """--max-concurrent-episodes 2 --max-queued-episodes 1: two run, one waits, the next is refused at once with a
    JSON 503 (Retry-After) that the runtime reads as infrastructure; the queued one then runs."""
    flags = ("--max-concurrent-episodes", "2", "--max-queued-episodes", "1", "--admission-timeout", "60")
    async with (
        await spawn_env_server("multistep", extra_args=flags, log_path=tmp_path / "env.log") as env,
        EnvironmentClient(env.url, timeout_seconds=60) as client,
    ):
        slow = [MultiStepRequest(values=[1, 2, 3], step_delay_seconds=0.4) for _ in range(3)]
        running = [asyncio.create_task(client.run_episode(r, MultiStepResponse)) for r in slow]
        health = await _until(client, lambda h: h["episodes_in_flight"] == 2 and h["admission_queue_depth"] == 1)
        assert health["max_concurrent_episodes"] == 2
        async with aiohttp.ClientSession() as session, session.post(f"{env.url}/run", json={"values": [1]}) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
            body = await response.json()
        assert body["failure"]["stage"] == "admission"
        assert body["failure"]["terminal"] is False
        with pytest.raises(RolloutInfraFailure):
            await client.run_episode({"values": [1]}, MultiStepResponse)
        replies = await asyncio.gather(*running)
    assert [reply.totals for reply in replies] == [[1, 3, 6]] * 3


async def _until(client: EnvironmentClient, predicate: Callable[[dict[str, object]], bool]) -> dict[str, object]:
    """Poll the server's /health (another process: no event to await) until ``predicate`` holds."""
    for _ in range(600):
        health = await client.health()
        if predicate(health):
            return health
        await asyncio.sleep(0.05)
    raise AssertionError(f"never reached; last health {health}")


async def test_errors_reach_the_client_as_messages_never_as_stack_traces() -> None:
    """A bug in an episode is a terminal failure naming the error; a bug in a route is a bare JSON 500."""
    server = ProbeServer(EnvironmentServerConfig())
    app = web.Application(client_max_size=server.config.max_request_bytes)
    setup_environment_app(app, server)
    app.router.add_post("/run", server.handle_run)

    async def broken(_: web.Request) -> web.Response:
        raise RuntimeError("secret internals at /srv/app/handlers.py line 42")

    app.router.add_get("/broken", broken)
    running = await server.start(app)
    try:
        async with aiohttp.ClientSession() as session:
            request = ProbeRequest(fail="unhandled").model_dump(mode="json")
            async with session.post(f"{running.url}/run", json=request) as response:
                episode_text = await response.text()
            async with session.get(f"{running.url}/broken") as response:
                assert response.status == 500
                route_text = await response.text()
        async with EnvironmentClient(running.url) as client:
            with pytest.raises(RolloutTerminalDataFailure, match="KeyError"):
                await client.run_episode(ProbeRequest(fail="unhandled"))
    finally:
        await running.stop()
    for text in (episode_text, route_text):
        _no_trace(text)
    assert json.loads(episode_text)["failure"]["kind"] == "unhandled_exception"
    assert "secret internals" not in route_text
    assert json.loads(route_text)["error"]["code"] == "internal_error"
