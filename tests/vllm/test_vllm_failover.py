"""bench/failover.py's matrix on real vLLM servers (``--shards vllm``), at smoke size, on the session's servers: the
two shared ones and the victim as the three shards, in front of which the contenders take turns.

One scenario a real server can show (``stream-freeze``: two engines SIGSTOPped mid-stream, then SIGCONTed, so the
servers are left as found), with the library, its router and nginx. What is checked can fail, never speed: every
prompt is accounted for exactly once by every contender, the faults were really applied to the engines (the
injector's record), and neither rollout-fleet contender passes a real answer that is not well-formed (an ``abort``,
an empty or cut-off body) on as a completion.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rollout_runtime.vllm import VllmServer
from rollout_runtime.vllm.fleet import VllmFleet
from support.vllm import Victim

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from failover import Options, main_async  # noqa: E402
from failover_scenarios import SCENARIOS, VLLM_SMOKE  # noqa: E402

SCENARIO = "stream-freeze"
CONTENDERS = ["rollout-fleet", "router", "nginx"]
OURS = ("rollout-fleet", "router")


async def test_failover_smoke_on_real_vllm_accounts_for_every_prompt_once_and_its_faults_hit(
    vllm_shared: list[VllmServer], vllm_victim_holder: Victim
) -> None:
    victim = await vllm_victim_holder.ensure_fresh(base_weights=False)  # any weights: answers are judged by form
    fleet = VllmFleet.of({"shard-0": vllm_shared[0], "shard-1": vllm_shared[1], "shard-2": victim})
    options = Options(baseline=False)
    results, _ = await main_async([SCENARIOS[SCENARIO]], VLLM_SMOKE, [1], CONTENDERS, options, vllm=fleet)
    by_seed = results[SCENARIO]
    assert isinstance(by_seed, dict), results
    rows: dict[str, dict[str, Any]] = {row["name"]: row for row in by_seed["1"]}
    assert list(rows) == CONTENDERS
    for name, row in rows.items():
        assert row["repeated"] == 0, f"{name}: a prompt ended twice"
        assert row["completed"] + row["lost"] == row["prompts"] > 0, (name, row)
        assert row["errors"] + row["corrupt"] == row["lost"], (name, row)
        hits = row["hits"]
        assert hits["faults_applied"] == hits["faults_scheduled"] > 0, f"{name}: a fault was not applied: {row}"
    for name in OURS:
        assert rows[name]["corrupt"] == 0, f"{name} passed a malformed answer on as a completion: {rows[name]}"
    assert await fleet.restore() == [], "SIGCONT left a server that does not generate"
    vllm_victim_holder.dirty = False  # thawed and generating: left as found
