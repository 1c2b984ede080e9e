"""Each scenario of the failover matrix (bench/failover_scenarios.py) runs at smoke size in the suite, with the
library's dispatcher (and its router where it has its own path), and the run's accounts are checked (never speed):

- every prompt is accounted for exactly once by every contender (completed, a client-visible error, or corrupt);
- every fault of the schedule was applied to the shard processes, and the shards' own counters show it hit (429s at
  a cap, malformed 200s served, slowed requests, errors), so a scenario cannot silently measure a healthy fleet;
- neither the dispatcher nor the router ever passes a 200 that is not the answer to the caller as a completion, while
  nginx in front of the same gray shards does (the corrupt count can fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from failover_scenarios import SCENARIOS  # noqa: E402

OURS = ["rollout-fleet", "router"]
CONTENDERS = {"gray": [*OURS, "nginx"], "stream-freeze": OURS, "backpressure": OURS}
"""Who runs each smoke (the library everywhere; the router where it has its own path: bodies it judges, streams it
relays, 429s it answers), kept few so that all seven scenarios take a few minutes on a loaded machine."""


def run_smoke(scenario: str, contenders: list[str], tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "rows.json"
    command = [sys.executable, str(BENCH / "failover.py"), "--smoke", "--scenario", scenario, "--json", str(out)]
    done = subprocess.run(
        [*command, "--contenders", ",".join(contenders)], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows: list[dict[str, Any]] = json.loads(out.read_text())[scenario]["1"]
    assert [row["name"] for row in rows] == contenders, done.stdout
    return {row["name"]: row for row in rows}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_scenario_accounts_for_every_prompt_once_and_its_faults_hit(name: str, tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    contenders = CONTENDERS.get(name, ["rollout-fleet"])
    rows = run_smoke(name, contenders, tmp_path)
    for contender, row in rows.items():
        assert row["repeated"] == 0, f"{contender}: a prompt ended twice"
        assert row["completed"] + row["errors"] + row["corrupt"] == row["prompts"], (contender, row)
        assert sum(row["ledger"].values()) >= row["completed"], (contender, row["ledger"])
        hits = row["hits"]
        assert hits["faults_applied"] == hits["faults_scheduled"] > 0, (contender, hits)
        if scenario.hit != "faults_applied":
            assert hits[scenario.hit] > 0, f"{contender}: no {scenario.hit} at the shards, the fault never hit: {hits}"
    for contender in set(OURS) & set(rows):
        assert rows[contender]["corrupt"] == 0, f"{contender} passed a non-answer on as a completion"
    if name == "gray":
        assert rows["nginx"]["corrupt"] > 0, "nginx passes 200s through: the gray shards never reached the client"
