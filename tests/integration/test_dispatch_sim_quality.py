"""Gray failures on real simulated shards (subprocesses on 127.0.0.1): one garbles a share of its answers in
well-formed 200s (``SimFaults.garble_rate``), the dispatcher rolls out through the real GenerationClient with
logprobs, and only the outputs' statistics against the peers can tell."""

from __future__ import annotations

from rollout_runtime.dispatch import Completed, Dispatcher, DispatchEvent, DispatchPolicy, ShardQuarantined
from rollout_runtime.generation import GenerationClient, GenerationOptions
from rollout_runtime.health import ProbeSettings
from rollout_runtime.results import Completion
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim import SimFaults, SimFleet
from support.dispatch import assert_accounted, collect

PROBES = ProbeSettings(period_seconds=0.3, timeout_seconds=0.25, failure_threshold=2, success_threshold=1)
POLICY = DispatchPolicy(
    backoff_initial_seconds=0.05, backoff_max_seconds=0.5, healthy_wait_seconds=60, max_concurrency=8
)
MAX_TOKENS = 32
"""Above every healthy answer (echoes of 1-30 words): a garbled answer runs to it, as a broken engine runs on."""
OPTIONS = GenerationOptions(logprobs=0)


def prompts(count: int) -> list[str]:
    """Echo prompts of 1-30 words: the sim answers each with itself, so healthy lengths and logprobs vary."""
    return [" ".join(f"w{i}x{k}" for k in range(i % 30 + 1)) for i in range(count)]


async def run_fleet(garble_rate: float, count: int) -> tuple[list[DispatchEvent], list[Completed[str, Completion]]]:
    events: list[DispatchEvent] = []
    faults = {"shard-2": SimFaults(garble_rate=garble_rate)}
    async with (
        SimFleet(4, faults=faults) as fleet,
        GenerationClient(timeout_seconds=60) as client,
        Dispatcher(LocalShardSource(fleet.shards, PROBES), POLICY, observer=events.append, seed=0) as dispatcher,
    ):

        async def rollout(shard: Shard, prompt: str) -> Completion:
            return await client.complete(shard, prompt, max_tokens=MAX_TOKENS, options=OPTIONS)

        await dispatcher.wait_ready(min_shards=4, timeout=60)
        batch = prompts(count)
        run = dispatcher.run(batch, rollout)
        outcomes = await collect(run)
    assert_accounted(run, outcomes, range(count))
    completed = [o for o in outcomes if isinstance(o, Completed)]
    assert len(completed) == count
    return events, completed


async def test_a_shard_garbling_ten_percent_is_quarantined_within_a_window_and_only_it() -> None:
    events, completed = await run_fleet(0.10, 800)
    quarantines = [e for e in events if isinstance(e, ShardQuarantined)]
    assert quarantines, "a shard garbling 10% of its answers was never quarantined"
    assert {q.shard for q in quarantines} == {"shard-2"}, "a healthy shard was quarantined"
    first = quarantines[0]
    assert first.test == "tail"
    assert first.signal in ("length", "logprob")
    assert first.evidence["samples"] <= 256
    assert first.evidence["rate"] >= 2 * first.evidence["peer_rate"]
    assert set(first.peers) == {"shard-0", "shard-1", "shard-3"}
    flagged = [n for n, o in enumerate(completed) if o.quality is not None]
    assert flagged, "the answer that completed the evidence is flagged"
    served = sum(1 for o in completed[: flagged[0]] if o.shard == "shard-2")
    assert served < 256, f"shard-2 served {served} samples before its quarantine (a window is 256; measured: 124)"
    assert {o.shard for o in completed if o.quality is not None} == {"shard-2"}


async def test_a_rare_garble_quarantines_no_healthy_shard() -> None:
    """At 0.1% a window of 256 holds 0.26 garbled answers: below what the detector can see (docs/blame.md), and the
    three healthy shards, about 200 samples each, are never quarantined."""
    events, completed = await run_fleet(0.001, 800)
    assert not [e for e in events if isinstance(e, ShardQuarantined) and e.shard != "shard-2"]
    assert all(o.quality is None for o in completed if o.shard != "shard-2")
