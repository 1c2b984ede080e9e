"""scripts/reliability_report.py turns the suite's JSON reports into docs/reliability.md's figures."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from support.tools import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "reliability_report.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reliability_report", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chaos(name: str, *, prompts: int, lost: int = 0, error: str | None = None) -> dict[str, object]:
    return {
        "scenario": name, "seed": 1, "prompts": prompts, "completed": prompts - 3, "data_failed": 3, "aborted": 0,
        "lost": lost, "run_error": error, "faults_injected": {"shard_kill": 1, "env_crash": 1}, "redispatches": 7,
        "ejections": 2, "resumed_from_checkpoint": 4, "checkpointed_episodes": 4, "seconds": 12.5,
        "invariant_violations": [], "leaked_tasks": 0, "leaked_sockets": 0,
        "fault_costs": {
            "shard_kill": {"failed_attempts": 10, "redispatches": 10, "affected_prompts": 9,
                           "failed_attempt_mean_seconds": 0.01, "extra_latency_mean_seconds": 2.0},
            "env_crash": {"failed_attempts": 30, "redispatches": 30, "affected_prompts": 12,
                          "failed_attempt_mean_seconds": 0.2, "extra_latency_mean_seconds": None},
        },
    }  # fmt: skip


def test_the_generated_section_sums_the_reports_and_leaves_the_prose_alone(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    for name, data in {
        "seed-1": _chaos("seed-1", prompts=2000),
        "seed-2": _chaos("seed-2", prompts=2000),
        "bad-input": {"scenario": "bad-input", "tried": 38, "rejected": 38},
        "fuzz-probe": {"scenario": "fuzz-probe", "cases": 800},
        "rbac": {"scenario": "rbac", "operator": {"refused": 24}, "trainer": {"refused": 11}},
    }.items():
        (reports / f"{name}.json").write_text(json.dumps(data))
    doc = tmp_path / "reliability.md"
    doc.write_text(
        "# Title\n\nprose\n\n<!-- reliability-report:begin -->\nold\n<!-- reliability-report:end -->\n\nafter\n"
    )

    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--reports", str(reports), "--doc", str(doc)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    text = doc.read_text()
    assert text.startswith("# Title\n\nprose\n")
    assert text.endswith("\nafter\n")
    assert "old" not in text
    assert "| prompts driven | 4000 |" in text
    assert "| **prompts lost** | **0** |" in text
    assert "| shard_kill | 2 |" in text
    assert "| shard_kill | 10.0 | 10.0 | 9.0 | 0.01 | 2.00 |" in text
    assert "| env_crash | 30.0 | 30.0 | 12.0 | 0.20 | - |" in text
    assert "| shard_hang | 0 |" in text  # listed among the kinds, with no cost row: never injected
    assert "| shard_hang | -" not in text
    assert "| invalid custom resources sent to the API server | 38 | 38 rejected |" in text
    assert "| forbidden API requests by the operator's token | 24 | all 403 |" in text
    check = subprocess.run([sys.executable, str(SCRIPT), "--reports", str(reports), "--doc", str(doc), "--check"])
    assert check.returncode == 0


def test_lost_prompts_show_in_the_summary() -> None:
    rendered = _module().render({"seed-1": _chaos("seed-1", prompts=10, lost=2)})
    assert "| **prompts lost** | **2** |" in rendered
