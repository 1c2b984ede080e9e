"""The main job, end to end: `rollout-fleet demo` survives its chaos schedule and accounts for every prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rollout_runtime.demo import DemoConfig, demo_prompts, run_demo
from rollout_runtime.demo_shards import sim_chaos


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, {"fleet": "local", "namespace": "", **labels})
    return 0.0 if value is None else value


def test_demo_cli_runs_end_to_end_and_reports_every_prompt(tmp_path: Path) -> None:
    report_dir = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "rollout_runtime.cli", "demo", "--prompts", "300", "--metrics-port", "0",
         "--report-dir", str(report_dir)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    stats = report["stats"]
    assert report["invariant_holds"] is True
    assert report["error"] is None
    assert stats["submitted"] == 300
    assert stats["completed"] + stats["data_failed"] == 300
    assert stats["data_failed"] == 5, report["data_failures"]
    assert all(
        f["over_long"] and "maximum context length is 256 tokens" in f["reason"] for f in report["data_failures"]
    )
    assert [fault["kind"] for fault in report["chaos"]] == [
        fault.kind.value for fault in sim_chaos(["a", "b", "c", "d"]).faults
    ]
    assert report["mean_reward"] == 1.0  # no failed attempt ever became a (zero-reward) result
    assert report["environment_servers_killed"] == ["env-0"]  # and every episode still scored, on env-1
    ledger = [json.loads(line) for line in (report_dir / "failures.jsonl").read_text().splitlines()]
    assert sorted(entry["prompt_id"] for entry in ledger) == sorted(f["prompt_id"] for f in report["data_failures"])
    assert "demo summary" in done.stdout
    assert "accounting invariant (every prompt ends exactly once): holds" in done.stdout
    weights = report["weights"]
    assert weights["policy_version"] == 1
    assert weights["committed_by_version"] == {"1": 295}
    assert weights["stale_committed"] == 0
    assert "weights: stale results committed (must be 0)" in done.stdout
    # the killed shard restarts at base weights ("default"), is Stale, and the trainer's refitter brings it back
    assert any("restarted with base weights" in line or "refit shard-" in line for line in report["timeline"])
    assert weights["refits"] >= 1, report["timeline"]


@pytest.mark.parametrize("chaos", [True, False])
async def test_demo_metrics_match_the_run(tmp_path: Path, chaos: bool) -> None:
    registry = CollectorRegistry()
    config = DemoConfig(prompts=200, over_long_prompts=3, chaos=chaos, report_dir=tmp_path, shard_latency_seconds=0.05)
    report = await run_demo(config, registry=registry)
    stats = report.stats
    assert report.invariant_holds
    assert stats["completed"] + stats["data_failed"] == 200
    assert sample(registry, "rollout_prompts_total", result="completed") == stats["completed"]
    assert sample(registry, "rollout_prompts_total", result="data_failed") == stats["data_failed"] == 3
    assert sample(registry, "rollout_attempts_total", outcome="success") == stats["successes"]
    assert sample(registry, "rollout_attempts_total", outcome="infra_failure") == stats["infra_failures"]
    assert sample(registry, "rollout_redispatches_total") == stats["redispatches"]
    assert sum(report.ejections_by_shard.values()) == stats["ejections"]
    if not chaos:
        assert stats["infra_failures"] == 0
        # Each over-long prompt uses its data budget of 2, plus one attempt (charged as infra) for each refusal from a
        # shard that had served nothing yet while others had: blame does not let such a refusal alone convict it.
        assert 197 + 3 * 2 <= stats["attempts"] <= 197 + 3 * 5
        assert stats["attempts"] == 197 + stats["data_failures"]


def test_demo_prompts_are_deterministic_and_include_over_long_ones() -> None:
    config = DemoConfig(prompts=50, over_long_prompts=4, seed=7)
    first, second = demo_prompts(config), demo_prompts(config)
    assert first == second
    assert len(first) == 50
    assert sum(p.over_long for p in first) == 4


def test_invalid_demo_options_are_rejected_clearly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rollout_runtime.cli", "demo", "--shards", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "shards" in done.stderr
    assert "greater than or equal to 1" in done.stderr
