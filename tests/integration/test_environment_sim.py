"""The example environments served by ``rollout-fleet sim-env`` as real subprocesses, against a real sim shard."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout_runtime.cli.sim_env import sim_env
from rollout_runtime.environment import EnvironmentClient
from rollout_runtime.failures import RolloutInfraFailure, RolloutTerminalDataFailure
from rollout_runtime.sim.env_process import SimEnvProcess, spawn_env_server
from rollout_runtime.sim.environments import ArithmeticResponse, MultiStepResponse
from rollout_runtime.sim.fleet import SimFleet


@pytest.fixture
async def verifier(tmp_path: Path) -> AsyncIterator[SimEnvProcess]:
    process = await spawn_env_server("verifier", log_path=tmp_path / "verifier.log")
    async with process:
        yield process


async def test_the_verifier_scores_right_and_wrong_answers(verifier: SimEnvProcess) -> None:
    async with EnvironmentClient(verifier.url) as client:
        right = await client.run_episode({"problem": "12 * 7", "answer": "12 times 7 is 84"}, ArithmeticResponse)
        wrong = await client.run_episode({"problem": "12 * 7", "answer": "about 80, I think"}, ArithmeticResponse)
        silent = await client.run_episode({"problem": "12 * 7", "answer": "no idea"}, ArithmeticResponse)

    assert (right.reward, right.expected, right.parsed_answer) == (1.0, 84, 84)
    assert (wrong.reward, wrong.parsed_answer) == (0.0, 80)
    assert (silent.reward, silent.parsed_answer) == (0.0, None)


async def test_the_verifier_refuses_a_problem_it_cannot_parse_terminally(verifier: SimEnvProcess) -> None:
    async with EnvironmentClient(verifier.url) as client:
        with pytest.raises(RolloutTerminalDataFailure, match="parse_problem"):
            await client.run_episode({"problem": "__import__('os')", "answer": "0"})


async def test_the_verifier_asks_a_generation_shard_and_maps_its_failures(verifier: SimEnvProcess) -> None:
    # the sim tokenizer counts words: "What is 17+25? Answer with a number." is 7, plus 32 completion tokens = 39
    async with SimFleet(1, max_model_len=39) as fleet, EnvironmentClient(verifier.url) as client:
        shard = fleet.shards[0]
        asked = await client.run_episode({"problem": "17+25", "generation_url": shard.endpoint}, ArithmeticResponse)
        assert asked.reward == 1.0
        assert asked.parsed_answer == 42

        await fleet.set_faults(shard.name, fail_next=1, error_status=503)
        with pytest.raises(RolloutInfraFailure, match="generate") as sick:
            await client.run_episode({"problem": "17+25", "generation_url": shard.endpoint})
        assert "503" in str(sick.value)

        with pytest.raises(RolloutTerminalDataFailure, match="maximum context length"):  # 9 + 32 > 39: a bad prompt
            await client.run_episode({"problem": "17 + 25", "generation_url": shard.endpoint})


async def test_the_multistep_environment_runs_with_a_local_sandbox_and_checkpoints(tmp_path: Path) -> None:
    process = await spawn_env_server("multistep", checkpoint_dir=tmp_path / "ckpt", log_path=tmp_path / "ms.log")
    async with process, EnvironmentClient(process.url) as client:
        reply = await client.run_episode({"episode_id": "local-1", "values": [5, -2, 10]}, MultiStepResponse)
        health = await client.health()

    assert reply.reward == 1.0
    assert reply.totals == [5, 3, 13]
    assert health["checkpointing"] is True
    assert health["episodes_in_flight"] == 0
    assert list((tmp_path / "ckpt").iterdir()) == []


async def test_a_graceful_stop_exits_cleanly(tmp_path: Path) -> None:
    process = await spawn_env_server("verifier", log_path=tmp_path / "v.log")
    await process.stop()
    assert process.process.returncode == 0


def test_the_cli_refuses_a_concurrency_limit_without_an_admission_timeout() -> None:
    result = CliRunner().invoke(sim_env, ["--kind", "verifier", "--max-concurrent-episodes", "4"])
    assert result.exit_code == 2
    assert "admission_timeout_seconds is required" in result.output


def test_the_cli_lists_its_kinds() -> None:
    result = CliRunner().invoke(sim_env, ["--help"])
    assert result.exit_code == 0
    assert "verifier" in result.output
    assert "multistep" in result.output
    assert "--checkpoint-dir" in result.output
