"""An environment server over real HTTP on 127.0.0.1: bad input, health, metrics, and the client's failure mapping."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import pickle
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from rollout_runtime.environment import (
    EnvironmentClient,
    EnvironmentServerConfig,
    RunningServer,
    setup_environment_app,
)
from rollout_runtime.failures import (
    FailureClass,
    GymTransportError,
    RolloutDataFailure,
    RolloutInfraFailure,
    RolloutTerminalDataFailure,
    RolloutTimeout,
    classify_rollout_failure,
)
from support.environment import ProbeRequest, ProbeServer, until

MAX_BODY = 4096


@pytest.fixture
async def served() -> AsyncIterator[tuple[ProbeServer, RunningServer]]:
    server = ProbeServer(
        EnvironmentServerConfig(
            max_request_bytes=MAX_BODY, max_concurrent_episodes=1, max_queued_episodes=0, admission_timeout_seconds=60
        )
    )
    running = await server.start()
    try:
        yield server, running
    finally:
        server.release.set()
        await running.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _assert_still_serving(session: aiohttp.ClientSession, url: str) -> None:
    async with session.post(f"{url}/run", json={"episode_id": "after"}) as response:
        assert response.status == 200
        assert (await response.json())["reward"] == 1.0


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "malformed_json"),
        (b"", 400, "empty_body"),
        (b"\xff\xfe\xfa", 400, "malformed_json"),
        (b'{"episode_id": "ok", "hold": "sometimes"}', 422, "invalid_request"),
        (b'{"episode_id": "../../etc/passwd"}', 422, "invalid_request"),
        (b'{"unknown_field": 1}', 422, "invalid_request"),
        (b"[1, 2, 3]", 422, "invalid_request"),
        (b'{"pad": "' + b"x" * (MAX_BODY + 10) + b'"}', 413, "request_too_large"),
    ],
    ids=["malformed", "empty", "not-utf8", "wrong-type", "unsafe-id", "unknown-field", "not-an-object", "oversized"],
)
async def test_bad_input_gets_a_clear_json_4xx_and_the_server_keeps_serving(
    served: tuple[ProbeServer, RunningServer], http: aiohttp.ClientSession, body: bytes, status: int, code: str
) -> None:
    server, running = served
    async with http.post(f"{running.url}/run", data=body, headers={"Content-Type": "application/json"}) as response:
        assert response.status == status
        assert response.content_type == "application/json"
        error = (await response.json())["error"]
        text = await response.text()

    assert error["status"] == status
    assert error["code"] == code
    assert error["message"]
    assert "Traceback" not in text
    assert server.started == 0
    await _assert_still_serving(http, running.url)


async def test_a_chunked_body_over_the_limit_is_refused_too(
    served: tuple[ProbeServer, RunningServer], http: aiohttp.ClientSession
) -> None:
    _, running = served

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b"x" * 1024

    async with http.post(f"{running.url}/run", data=chunks()) as response:
        assert response.status == 413
        assert (await response.json())["error"]["code"] == "request_too_large"
    await _assert_still_serving(http, running.url)


async def test_wrong_types_name_the_field_without_echoing_the_input(
    served: tuple[ProbeServer, RunningServer], http: aiohttp.ClientSession
) -> None:
    _, running = served
    async with http.post(f"{running.url}/run", json={"hold": "secret-value-xyz"}) as response:
        error = (await response.json())["error"]
    assert error["details"][0]["loc"] == ["hold"]
    assert "secret-value-xyz" not in str(error)


async def test_unknown_paths_and_methods_are_json_errors(
    served: tuple[ProbeServer, RunningServer], http: aiohttp.ClientSession
) -> None:
    _, running = served
    async with http.get(f"{running.url}/nope") as response:
        assert response.status == 404
        assert (await response.json())["error"]["status"] == 404
    async with http.get(f"{running.url}/run") as response:
        assert response.status == 405
        assert (await response.json())["error"]["status"] == 405


async def test_health_reports_load_and_metrics_expose_the_environment_names(
    served: tuple[ProbeServer, RunningServer], http: aiohttp.ClientSession
) -> None:
    server, running = served
    holding = asyncio.create_task(http.post(f"{running.url}/run", json={"episode_id": "held", "hold": True}))
    await until(lambda: server.running == 1, yields=100_000)

    async with http.get(f"{running.url}/health") as response:
        health = await response.json()
        assert response.status == 200
    assert health["status"] == "ok"
    assert health["protocol"] == "probe"
    assert health["episodes_in_flight"] == 1

    async with http.get(f"{running.url}/metrics") as response:
        exposition = await response.text()
    for name in (
        'environment_episodes_total{outcome="success"}',
        "environment_episode_duration_seconds_bucket",
        "environment_cleanup_failures_total",
        'environment_dependency_failures_total{retryable="true"}',
        "environment_episodes_in_flight 1.0",
        "environment_admission_queue_depth 0.0",
    ):
        assert name in exposition

    server.release.set()
    async with await holding as response:
        assert response.status == 200


async def test_aggregate_metrics_endpoint_summarises_scores_per_task(
    served: tuple[ProbeServer, RunningServer], http: aiohttp.ClientSession
) -> None:
    _, running = served
    rollouts = [
        {"task_id": "t1", "reward": 1.0},
        {"task_id": "t1", "reward": 0.0},
        {"task_id": "t1"},
        {"task_id": "t2", "reward": 0.5},
    ]
    async with http.post(f"{running.url}/aggregate_metrics", json={"rollouts": rollouts}) as response:
        tasks = (await response.json())["tasks"]
    assert tasks["t1"]["rollouts"] == 3
    assert tasks["t1"]["failed"] == 1
    assert tasks["t1"]["mean_reward"] == 0.5
    assert tasks["t1"]["solved"] is True
    assert tasks["t2"]["pass_rate"] == 0.0


async def test_a_custom_app_must_call_the_setup_helper_before_serving_episodes(http: aiohttp.ClientSession) -> None:
    server = ProbeServer()
    bare = web.Application()
    bare.router.add_post("/run", server.handle_run)
    running = await server.start(bare)
    try:
        async with http.post(f"{running.url}/run", json={}) as response:
            assert response.status == 500
            assert "Traceback" not in await response.text()
        assert server.started == 0
    finally:
        await running.stop()

    custom = web.Application()
    setup_environment_app(custom, server)
    custom.router.add_post("/episodes", server.handle_run)
    running = await server.start(custom)
    try:
        async with http.post(f"{running.url}/episodes", json={"episode_id": "custom"}) as response:
            assert response.status == 200
        assert server.started == 1
    finally:
        await running.stop()


# -- the client: every failure in the taxonomy's terms, already picklable ---------------------------------------


def _crosses_a_process_boundary(exc: BaseException) -> BaseException:
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert classify_rollout_failure(copy) is classify_rollout_failure(exc)
    assert getattr(copy, "status", None) == getattr(exc, "status", None)
    return copy


async def test_client_success_returns_the_typed_reply(served: tuple[ProbeServer, RunningServer]) -> None:
    _, running = served
    async with EnvironmentClient(running.url) as client:
        reply = await client.run_episode(ProbeRequest(episode_id="fine"))
    assert reply.reward == 1.0
    assert reply.episode_id == "fine"


async def test_client_maps_a_refused_connection_to_gym_transport_error() -> None:
    server = ProbeServer()
    running = await server.start()
    url = running.url
    await running.stop()  # nothing listens there any more

    async with EnvironmentClient(url) as client:
        with pytest.raises(GymTransportError) as caught:
            await client.run_episode(ProbeRequest())
    assert classify_rollout_failure(caught.value) is FailureClass.INFRA
    assert "ClientConnectorError" in str(_crosses_a_process_boundary(caught.value))


@pytest.mark.parametrize(
    ("fail", "expected"),
    [
        ("handled", RolloutTerminalDataFailure),
        ("unhandled", RolloutTerminalDataFailure),
        ("dependency-terminal", RolloutTerminalDataFailure),
        ("dependency-retryable", RolloutInfraFailure),
    ],
)
async def test_client_maps_episode_failures_by_their_terminal_flag(
    served: tuple[ProbeServer, RunningServer], fail: str, expected: type[Exception]
) -> None:
    _, running = served
    async with EnvironmentClient(running.url) as client:
        with pytest.raises(expected) as caught:
            await client.run_episode(ProbeRequest(fail=fail))
    assert type(caught.value) is expected
    failure_class = FailureClass.DATA if issubclass(expected, RolloutDataFailure) else FailureClass.INFRA
    assert classify_rollout_failure(_crosses_a_process_boundary(caught.value)) is failure_class


async def test_client_maps_an_admission_rejection_to_infra(served: tuple[ProbeServer, RunningServer]) -> None:
    server, running = served
    async with EnvironmentClient(running.url) as client:
        holder = asyncio.create_task(client.run_episode(ProbeRequest(episode_id="holder", hold=True)))
        await until(lambda: server.running == 1, yields=100_000)
        with pytest.raises(RolloutInfraFailure) as caught:
            await client.run_episode(ProbeRequest(episode_id="extra"))
        server.release.set()
        await holder
    assert caught.value.status == 503
    assert "admission" in str(caught.value)
    _crosses_a_process_boundary(caught.value)


async def test_client_maps_an_episode_timeout_to_rollout_timeout() -> None:
    server = ProbeServer(EnvironmentServerConfig(default_episode_timeout_seconds=0.05))
    running = await server.start()
    try:
        async with EnvironmentClient(running.url) as client:
            with pytest.raises(RolloutTimeout):
                await client.run_episode(ProbeRequest(hold=True))
    finally:
        await running.stop()


async def test_client_maps_bad_requests_to_data_and_server_errors_without_a_reply_to_infra() -> None:
    async def broken(_: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>bad gateway</html>")

    app = web.Application()
    app.router.add_post("/run", broken)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    gateway = f"http://127.0.0.1:{runner.addresses[0][1]}"
    server = ProbeServer()
    running = await server.start()
    try:
        async with EnvironmentClient(gateway) as client:
            with pytest.raises(GymTransportError) as infra:
                await client.run_episode({"episode_id": "x"})
        async with EnvironmentClient(running.url) as client:
            with pytest.raises(RolloutDataFailure) as data:
                await client.run_episode({"hold": "not-a-bool"})
    finally:
        await running.stop()
        await runner.cleanup()
    assert infra.value.status == 502
    assert data.value.status == 422
    assert "hold" in str(data.value)
    assert not isinstance(data.value, RolloutTerminalDataFailure)


def _run_in_child(url: str, request: dict[str, object]) -> None:
    """Runs in a spawned worker process: its failure comes back to the parent by pickling."""

    async def run() -> None:
        async with EnvironmentClient(url) as client:
            await client.run_episode(request)

    asyncio.run(run())


@pytest.mark.parametrize(
    ("request_body", "expected", "failure_class"),
    [
        ({"fail": "handled"}, RolloutTerminalDataFailure, FailureClass.DATA),
        ({"fail": "dependency-retryable"}, RolloutInfraFailure, FailureClass.INFRA),
    ],
)
async def test_client_failures_cross_a_real_process_boundary_with_their_class(
    served: tuple[ProbeServer, RunningServer],
    request_body: dict[str, object],
    expected: type[Exception],
    failure_class: FailureClass,
) -> None:
    _, running = served
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool, pytest.raises(expected) as caught:
        await loop.run_in_executor(pool, _run_in_child, running.url, request_body)
    assert type(caught.value) is expected
    assert classify_rollout_failure(caught.value) is failure_class
