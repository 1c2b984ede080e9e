"""Episode identity against the real environment server process: one live attempt per id, disconnects, storage faults.

The multi-step sim environment keeps its sandbox on a tool server run by this test, so the test sees every step
each attempt applies and can hold a step to put an attempt exactly where it wants. Progress is observed through
the server's own ``/health`` and ``/metrics``, never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollout_runtime.environment import EnvironmentClient
from rollout_runtime.failures import FailureClass, RolloutInfraFailure, classify_rollout_failure, http_status_is_infra
from rollout_runtime.sim.env_process import SimEnvProcess, spawn_env_server
from rollout_runtime.sim.environments import MultiStepResponse
from support.environment import killed_at_exit, until
from support.tool_server import ToolServer, serve_tool_server

VALUES = [1, 2, 3, 4, 5]
TOTALS = [1, 3, 6, 10, 15]


@pytest.fixture
async def tool() -> AsyncIterator[ToolServer]:
    async with serve_tool_server() as server:
        yield server


@pytest.fixture
async def processes() -> AsyncIterator[list[SimEnvProcess]]:
    async with killed_at_exit() as started:
        yield started


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _spawn(
    processes: list[SimEnvProcess], tmp_path: Path, *, checkpoint_dir: Path | None = None, wait: float = 120.0
) -> SimEnvProcess:
    process = await spawn_env_server(
        "multistep",
        checkpoint_dir=checkpoint_dir,
        log_path=tmp_path / f"sim-env-{len(processes)}.log",
        extra_args=("--duplicate-attempt-wait", str(wait)),
    )
    processes.append(process)
    return process


async def _health(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/health") as response:
        body: dict[str, Any] = await response.json()
        return body


async def _eventually(
    session: aiohttp.ClientSession, url: str, holds: Callable[[dict[str, Any]], bool], *, polls: int = 2000
) -> None:
    """Poll the server's ``/health`` until ``holds`` (each poll is a real round trip; no sleeping)."""
    for _ in range(polls):
        if holds(await _health(session, url)):
            return
    raise AssertionError(f"the server never reported the expected state; last: {await _health(session, url)}")


async def _metric(session: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name}{labels}")


async def _post_run(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any, Any]:
    async with session.post(f"{url}/run", json=body) as response:
        return response.status, response.headers, await response.json()


async def _export_at_step_3(client: EnvironmentClient, release_2: asyncio.Event, episode_id: str) -> None:
    """With step 2 held on the tool, open a checkpoint, let step 2 finish, and wait for its export."""
    await client.begin_checkpoint()
    release_2.set()
    manifest = await client.open_checkpoint()
    assert manifest.episodes[episode_id].next_step == "apply-3"


@contextlib.contextmanager
def _read_only(directory: Path) -> Iterator[None]:
    """Make ``directory`` read-only, also for root (a read-only bind mount; chmod does not stop root)."""
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)
        return
    try:
        subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a directory read-only for root here: {exc}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=False, capture_output=True)


async def test_a_second_attempt_of_a_live_episode_is_refused_as_infra_and_never_runs_a_step(
    tool: ToolServer, processes: list[SimEnvProcess], tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    server = await _spawn(processes, tmp_path, checkpoint_dir=tmp_path / "checkpoints", wait=0)
    request = {"episode_id": "dup-1", "values": VALUES, "tool_url": tool.url}
    reached, release = tool.hold("dup-1", 2)
    async with EnvironmentClient(server.url) as first, EnvironmentClient(server.url) as second:
        attempt = asyncio.create_task(first.run_episode(request, MultiStepResponse))
        await reached.wait()  # the first attempt is live, in step 2

        status, headers, body = await _post_run(http, server.url, request)
        assert status == 409
        assert headers["Retry-After"] == "1"
        assert body["failure"]["kind"] == "episode_in_progress"
        assert body["failure"]["terminal"] is False
        assert "already has a live attempt" in body["failure"]["reason"]

        with pytest.raises(RolloutInfraFailure) as caught:  # the runtime's client: infra, retried later
            await second.run_episode(request, MultiStepResponse)
        assert classify_rollout_failure(caught.value) is FailureClass.INFRA
        assert "episode_in_progress" in str(caught.value)

        release.set()
        reply = await attempt

    assert reply.totals == TOTALS
    assert reply.steps_run == [0, 1, 2, 3, 4]
    assert tool.applied["dup-1"] == [0, 1, 2, 3, 4]  # the refused attempts never ran a step
    assert await _metric(http, server.url, "environment_duplicate_attempts_total", action="refused") == 2


async def test_a_redispatch_waits_for_the_abandoned_attempt_then_continues_the_checkpoint_it_left(
    tool: ToolServer, processes: list[SimEnvProcess], tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    checkpoint_dir = tmp_path / "checkpoints"
    server = await _spawn(processes, tmp_path, checkpoint_dir=checkpoint_dir)
    request = {"episode_id": "redo-1", "values": VALUES, "tool_url": tool.url}
    reached_2, release_2 = tool.hold("redo-1", 2)
    reached_3, release_3 = tool.hold("redo-1", 3)
    async with EnvironmentClient(server.url) as first, EnvironmentClient(server.url) as second:
        abandoned = asyncio.create_task(first.run_episode(request, MultiStepResponse))
        await reached_2.wait()
        await _export_at_step_3(first, release_2, "redo-1")
        await first.resume_checkpoint()
        await reached_3.wait()  # the first attempt is live again, in step 3

        redispatch = asyncio.create_task(second.run_episode(request, MultiStepResponse))
        await _eventually(http, server.url, lambda h: h["attempts_waiting"] == 1)
        assert tool.applied["redo-1"] == [0, 1, 2]  # the waiting attempt has not started anything

        abandoned.cancel()  # the caller gives up: its connection closes, the server cancels that attempt
        with contextlib.suppress(asyncio.CancelledError):
            await abandoned
        reply = await redispatch
        release_3.set()  # the abandoned attempt's orphaned step 3 lands on the tool only now

    assert reply.totals == TOTALS
    assert reply.continued_from_step == 3  # the abandoned attempt kept, and never deleted, its checkpoint
    assert reply.steps_run == [3, 4]
    assert len(tool.closed) == 2  # both attempts released their sandbox
    assert not (checkpoint_dir / "redo-1.checkpoint.json").exists()  # the live attempt finished: dropped
    assert await _metric(http, server.url, "environment_duplicate_attempts_total", action="waited") == 1


async def test_a_client_disconnect_cancels_the_episode_and_runs_its_cleanup(
    tool: ToolServer, processes: list[SimEnvProcess], tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    server = await _spawn(processes, tmp_path)
    request = {"episode_id": "gone-1", "values": VALUES, "tool_url": tool.url}
    reached, release = tool.hold("gone-1", 2)
    async with EnvironmentClient(server.url) as client:
        attempt = asyncio.create_task(client.run_episode(request, MultiStepResponse))
        await reached.wait()
        attempt.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await attempt

    await _eventually(http, server.url, lambda h: h["episodes_in_flight"] == 0)  # cancelled, not run to its end
    assert len(tool.closed) == 1  # its cleanup released the sandbox
    release.set()
    await until(lambda: tool.applied["gone-1"] == [0, 1, 2])  # the step in flight at the disconnect lands...
    assert (await _health(http, server.url))["episodes_in_flight"] == 0
    assert tool.applied["gone-1"] == [0, 1, 2]  # ...and nothing after it ever runs
    assert await _metric(http, server.url, "environment_episodes_total", outcome="failed") == 1


@pytest.mark.parametrize("where", ["values", "step_delay_seconds", "top-level"])
async def test_a_5000_digit_integer_is_a_400_with_a_reason(
    where: str, processes: list[SimEnvProcess], tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    server = await _spawn(processes, tmp_path)
    huge = "9" * 5000
    body = {
        "values": f'{{"episode_id": "big", "values": [{huge}]}}',
        "step_delay_seconds": f'{{"episode_id": "big", "values": [1], "step_delay_seconds": {huge}}}',
        "top-level": huge,
    }[where]
    async with http.post(
        f"{server.url}/run", data=body.encode(), headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["code"] == "malformed_json"
    assert "digits" in error["message"]
    assert "Traceback" not in error["message"]
    status, _, reply = await _post_run(http, server.url, {"episode_id": "after", "values": [1, 2]})
    assert (status, reply["totals"]) == (200, [1, 3])  # still serving


async def test_a_checkpoint_path_that_is_a_directory_is_an_infra_failure_with_its_reason(
    tool: ToolServer, processes: list[SimEnvProcess], tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    checkpoint_dir = tmp_path / "checkpoints"
    (checkpoint_dir / "dir-1.checkpoint.json").mkdir(parents=True)
    server = await _spawn(processes, tmp_path, checkpoint_dir=checkpoint_dir)
    request = {"episode_id": "dir-1", "values": VALUES, "tool_url": tool.url}

    status, headers, body = await _post_run(http, server.url, request)
    assert status == 503
    assert http_status_is_infra(status)
    assert headers["Retry-After"] == "1"
    assert body["failure"]["kind"] == "checkpoint_store_failed"
    assert body["failure"]["terminal"] is False
    assert "IsADirectoryError" in body["failure"]["reason"]
    assert "dir-1.checkpoint.json" in body["failure"]["reason"]

    async with EnvironmentClient(server.url) as client:
        with pytest.raises(RolloutInfraFailure) as caught:
            await client.run_episode(request, MultiStepResponse)
    assert classify_rollout_failure(caught.value) is FailureClass.INFRA
    assert tool.applied["dir-1"] == []  # nothing ran on a store it could not read
    assert await _metric(http, server.url, "environment_checkpoint_store_failures_total", operation="load") == 2


async def test_a_finished_episode_is_never_continued_with_a_read_only_checkpoint_directory(
    tool: ToolServer, processes: list[SimEnvProcess], tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    checkpoint_dir = tmp_path / "checkpoints"
    checkpoint_dir.mkdir()
    server = await _spawn(processes, tmp_path, checkpoint_dir=checkpoint_dir)
    request = {"episode_id": "ro-1", "values": VALUES, "tool_url": tool.url}
    reached, release_2 = tool.hold("ro-1", 2)
    async with EnvironmentClient(server.url) as client:
        attempt = asyncio.create_task(client.run_episode(request, MultiStepResponse))
        await reached.wait()
        await _export_at_step_3(client, release_2, "ro-1")
        with _read_only(checkpoint_dir):
            await client.resume_checkpoint()
            finished = await attempt  # it cannot drop its checkpoint now
            assert finished.steps_run == [0, 1, 2, 3, 4]
            assert (checkpoint_dir / "ro-1.checkpoint.json").exists()
            assert await _metric(http, server.url, "environment_checkpoint_store_failures_total", operation="delete")

            again = await client.run_episode(request, MultiStepResponse)  # a redispatch after a lost reply
            assert again == finished  # the finished result, not a continuation from step 3
            assert tool.applied["ro-1"] == [0, 1, 2, 3, 4]

            await server.kill()  # across a restart nothing remembers it: the store refuses instead
            restarted = await _spawn(processes, tmp_path, checkpoint_dir=checkpoint_dir)
            status, _, body = await _post_run(http, restarted.url, request)
            assert status == 503
            assert body["failure"]["kind"] == "checkpoint_store_failed"
            assert "not writable" in body["failure"]["reason"]
            assert tool.applied["ro-1"] == [0, 1, 2, 3, 4]
