"""A real crash: kill -9 the environment server mid-episode, restart it, and lose nothing.

The multi-step sim environment keeps its sandbox on a tool server run by this test, so the test sees every step
the environment applies, across both processes, and can hold a step to put the episode exactly where it wants.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollout_runtime.environment import EnvironmentClient
from rollout_runtime.failures import (
    FailureClass,
    GymTransportError,
    RolloutTerminalDataFailure,
    classify_rollout_failure,
)
from rollout_runtime.sim.env_process import SimEnvProcess, spawn_env_server
from rollout_runtime.sim.environments import MultiStepResponse
from support.deadlines import within
from support.environment import killed_at_exit
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


async def _spawn(processes: list[SimEnvProcess], checkpoint_dir: Path, tmp_path: Path) -> SimEnvProcess:
    process = await spawn_env_server(
        "multistep", checkpoint_dir=checkpoint_dir, log_path=tmp_path / f"sim-env-{len(processes)}.log"
    )
    processes.append(process)
    return process


async def _crash_mid_episode(
    processes: list[SimEnvProcess], tool: ToolServer, tmp_path: Path, request: dict[str, object]
) -> Path:
    """Run ``request`` to a parked, exported checkpoint after step 2, then kill -9 the server."""
    checkpoint_dir = tmp_path / "checkpoints"
    first = await _spawn(processes, checkpoint_dir, tmp_path)
    reached, release = tool.hold(str(request["episode_id"]), 2)
    async with EnvironmentClient(first.url) as client:
        attempt = asyncio.create_task(client.run_episode(request, MultiStepResponse))
        await within(reached.wait(), "step 2 to reach the tool server")  # step 2 is in flight there
        await client.begin_checkpoint()
        release.set()  # step 2 finishes; the episode records "apply-3" and parks
        manifest = await client.open_checkpoint()
        assert manifest.episodes[str(request["episode_id"])].next_step == "apply-3"
        assert manifest.episodes[str(request["episode_id"])].steps_recorded == 3

        await first.kill()  # kill -9 while the episode is parked mid-way

        with pytest.raises(GymTransportError) as caught:
            await attempt
    assert classify_rollout_failure(caught.value) is FailureClass.INFRA  # the dispatcher redispatches it
    assert tool.applied[str(request["episode_id"])] == [0, 1, 2]
    return checkpoint_dir


async def test_a_killed_server_continues_the_episode_from_its_checkpoint_after_restart(
    tool: ToolServer, processes: list[SimEnvProcess], tmp_path: Path
) -> None:
    request = {"episode_id": "crash-1", "values": VALUES, "tool_url": tool.url}
    checkpoint_dir = await _crash_mid_episode(processes, tool, tmp_path, request)
    assert (checkpoint_dir / "crash-1.checkpoint.json").exists()
    lost_sandbox = next(iter(tool.open_sandboxes))  # cleanup dies with the process: the owner must reap it

    restarted = await _spawn(processes, checkpoint_dir, tmp_path)
    async with EnvironmentClient(restarted.url) as client:
        reply = await client.run_episode(request, MultiStepResponse)

    assert reply.reward == 1.0
    assert reply.totals == TOTALS
    assert reply.continued_from_step == 3
    assert reply.steps_run == [3, 4]
    assert tool.applied["crash-1"] == [0, 1, 2, 3, 4]  # every step applied exactly once across both processes
    assert tool.open_sandboxes == {lost_sandbox}  # the restarted attempt closed its own sandbox
    assert len(tool.closed) == 1
    assert not (checkpoint_dir / "crash-1.checkpoint.json").exists()  # finished: nothing left to continue


async def test_a_restart_only_episode_starts_over_from_its_input_after_a_crash(
    tool: ToolServer, processes: list[SimEnvProcess], tmp_path: Path
) -> None:
    checkpoint_dir = tmp_path / "checkpoints"
    first = await _spawn(processes, checkpoint_dir, tmp_path)
    request = {"episode_id": "restart-1", "values": VALUES, "tool_url": tool.url, "restart_only": True}
    reached, release = tool.hold("restart-1", 2)
    async with EnvironmentClient(first.url) as client:
        attempt = asyncio.create_task(client.run_episode(request, MultiStepResponse))
        await within(reached.wait(), "step 2 to reach the tool server")

        manifest = await client.open_checkpoint()  # returns although the episode is busy: it never holds one up

        assert "restart-1" not in manifest.episodes
        await first.kill()
        release.set()
        with pytest.raises(GymTransportError):
            await attempt
    assert not (checkpoint_dir / "restart-1.checkpoint.json").exists()  # never exported

    restarted = await _spawn(processes, checkpoint_dir, tmp_path)
    async with EnvironmentClient(restarted.url) as client:
        reply = await client.run_episode(request, MultiStepResponse)

    assert reply.reward == 1.0
    assert reply.totals == TOTALS
    assert reply.continued_from_step is None
    assert reply.steps_run == [0, 1, 2, 3, 4]
    # started over from its input; the orphaned step 2 still landed on the tool after the kill, which is why
    # an episode whose dependency cannot capture its part must be restart-only rather than continued
    assert tool.applied["restart-1"] == [0, 1, 2, 0, 1, 2, 3, 4]


async def test_a_corrupt_checkpoint_file_is_rejected_with_a_clear_error_after_restart(
    tool: ToolServer, processes: list[SimEnvProcess], tmp_path: Path
) -> None:
    request = {"episode_id": "torn-1", "values": VALUES, "tool_url": tool.url}
    checkpoint_dir = await _crash_mid_episode(processes, tool, tmp_path, request)
    path = checkpoint_dir / "torn-1.checkpoint.json"
    path.write_bytes(path.read_bytes()[:40])  # a torn file, as a broken disk or a bad copy would leave it

    restarted = await _spawn(processes, checkpoint_dir, tmp_path)
    async with EnvironmentClient(restarted.url) as client:
        with pytest.raises(RolloutTerminalDataFailure) as caught:
            await client.run_episode(request, MultiStepResponse)
        message = str(caught.value)
        assert "checkpoint" in message
        assert "is corrupt" in message
        assert str(path) in message
        assert tool.applied["torn-1"] == [0, 1, 2]  # nothing ran on a state it could not trust

        path.rename(path.with_suffix(".json.bad"))  # the operator's remedy: move it aside
        reply = await client.run_episode(request, MultiStepResponse)

    assert reply.totals == TOTALS
    assert reply.steps_run == [0, 1, 2, 3, 4]
