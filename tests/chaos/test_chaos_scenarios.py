"""Chaos: real shard and environment processes, a seeded fault schedule, and the invariants that must survive it.

Each scenario drives 2,000 prompts (generation on a simulated shard, then an environment episode) through the
dispatcher while every kind of fault in :class:`~rollout_runtime.sim.chaos.FaultKind` hits the fleet. Three seeds
run in CI; ``CHAOS_SEEDS=<n>`` (and optionally ``CHAOS_PROMPTS``) runs n more seeds as the long run. Each scenario
writes its JSON summary to ``reports/chaos/`` (``CHAOS_REPORT_DIR``), the source of docs/reliability.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollout_runtime.failures import RolloutRedispatchExhausted
from rollout_runtime.sim.chaos import FLEET_TARGET, GENERATED_KINDS, Fault, FaultKind, FaultSchedule
from support.chaos import (
    MULTISTEP_ENV,
    ScenarioConfig,
    check_invariants,
    run_scenario,
    summarize,
    write_report,
)

CI_SEEDS = [11, 23, 37]
LONG_SEEDS = list(range(1000, 1000 + int(os.environ.get("CHAOS_SEEDS", "0"))))
PROMPTS = int(os.environ.get("CHAOS_PROMPTS", "2000"))
SHARDS = [f"shard-{i}" for i in range(4)]


@pytest.mark.parametrize("seed", CI_SEEDS + LONG_SEEDS)
async def test_every_prompt_ends_exactly_once_while_seeded_faults_hit_the_fleet(seed: int, tmp_path: Path) -> None:
    schedule = FaultSchedule.generate(seed, SHARDS, environment=MULTISTEP_ENV)
    config = ScenarioConfig(name=f"seed-{seed}", seed=seed, prompts=PROMPTS, schedule=schedule)

    result = await run_scenario(config, tmp_path)
    problems = check_invariants(result)
    summary = summarize(result, problems)
    write_report(summary)

    assert not problems, "\n".join(problems)
    assert result.error is None, f"the run raised: {result.error!r}"
    assert summary["lost"] == 0
    assert summary["completed"] + summary["data_failed"] == PROMPTS
    assert set(summary["faults_injected"]) == {kind.value for kind in GENERATED_KINDS}, summary["faults_injected"]
    # The over-long and unparseable prompts are the data failures, each with its reason; nothing else failed.
    assert summary["data_failed"] == summary["prompt_kinds"].get("over_long", 0) + summary["prompt_kinds"].get(
        "bad_problem", 0
    )
    # Episodes the environment checkpointed before its crash continued from the checkpoint after the restart; the
    # crash must have caught some, or this would pass at 0/0 without showing anything.
    assert summary["checkpointed_episodes"] > 0, "the environment crash found no checkpointed episode in flight"
    assert summary["resumed_from_checkpoint"] >= summary["checkpointed_episodes"]


async def test_a_fleet_that_never_comes_back_ends_the_run_loudly_and_accounts_for_every_prompt(
    tmp_path: Path,
) -> None:
    schedule = FaultSchedule.of(
        [Fault(kind=FaultKind.ALL_SHARDS_DOWN, target=FLEET_TARGET, at_progress=0.2, hold_seconds=3600)]
    )
    config = ScenarioConfig(
        name="fleet-gone",
        seed=5,
        prompts=300,
        schedule=schedule,
        concurrency=16,
        policy={"healthy_wait_seconds": 1.0, "max_infra_attempts": 3, "backoff_max_seconds": 0.2},
    )

    result = await run_scenario(config, tmp_path)
    problems = check_invariants(result)
    summary = summarize(result, problems)
    write_report(summary)

    assert not problems, "\n".join(problems)
    assert isinstance(result.error, RolloutRedispatchExhausted)
    assert summary["aborted"] > 0
    assert summary["lost"] == 0
    assert summary["completed"] + summary["data_failed"] + summary["aborted"] == 300
