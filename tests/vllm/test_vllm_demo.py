"""``scripts/demo --shards vllm:2``: the main job on real vLLM servers, run as a user runs it (the script).

The demo starts its own servers (two here: the fewest its chaos needs, so the tier pays for two starts, not the
default three), freezes one's engine (``/health`` still 200: the generate probe and the attempt timeout take it out),
then SIGKILLs the other's whole process group and restarts it (base weights: Stale until the refitter reloads the
policy's weights through vLLM's endpoints). The report must account for every
prompt, commit nothing from stale weights, show both faults applied, and the refit of the restarted server.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.vllm import vllm_tool

REPO = Path(__file__).resolve().parents[2]
PROMPTS = 300


def test_the_demo_runs_on_real_vllm_servers_and_accounts_for_every_prompt(tmp_path: Path) -> None:
    tool = vllm_tool()  # ToolMissingError with the fix when absent
    report_dir = tmp_path / "report"
    env = {**os.environ, "ROLLOUT_FLEET_VLLM_TOOL": str(tool.directory)}
    done = subprocess.run(
        [str(REPO / "scripts" / "demo"), "--shards", "vllm:2", "--prompts", str(PROMPTS), "--metrics-port", "0",
         "--report-dir", str(report_dir)],
        capture_output=True, text=True, timeout=1100, check=False, env=env, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((report_dir / "report.json").read_text())
    stats, weights = report["stats"], report["weights"]
    assert report["invariant_holds"] is True
    assert report["error"] is None, report["timeline"]
    assert stats["submitted"] == PROMPTS
    over_long = report["config"]["over_long_prompts"]
    assert stats["completed"] == PROMPTS - over_long
    assert stats["data_failed"] == over_long, report["data_failures"]
    assert all(f["over_long"] for f in report["data_failures"]), "only the over-long prompts data-fail on vLLM too"
    kinds = {fault["kind"]: fault for fault in report["chaos"]}
    assert set(kinds) == {"shard_kill", "shard_hang"}, report["chaos"]
    assert all("error" not in fault for fault in report["chaos"]), "both faults were applied to the real processes"
    assert weights["policy_version"] == 1
    assert weights["stale_committed"] == 0
    assert weights["committed_by_version"] == {"1": PROMPTS - over_long}
    assert weights["refits"] >= 1, "the killed server came back Stale and was refit: " + "\n".join(report["timeline"])
    assert report["shard_phases"] == dict.fromkeys(report["shard_phases"], "Healthy"), report["shard_phases"]
    assert "started 2 vLLM servers" in "\n".join(report["timeline"])
