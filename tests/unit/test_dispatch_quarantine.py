"""Gray failures through the Dispatcher: a shard answering 200 with outputs unlike its peers' is quarantined (ejected,
an event with the evidence, a metric, a ledger line, its late results flagged), and a healthy fleet never is."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from rollout_runtime.dispatch import (
    Completed,
    Dispatcher,
    DispatchEvent,
    DispatchPolicy,
    FailureLedger,
    ShardQuarantined,
    ShardRestored,
)
from rollout_runtime.dispatch.quality import SIGNALS
from rollout_runtime.metrics import QUALITY_SIGNALS
from rollout_runtime.results import Choice, Completion
from rollout_runtime.shards import Shard, StaticShardSource
from support.dispatch import assert_accounted, collect, make_shards

FAST = DispatchPolicy(backoff_initial_seconds=0, backoff_max_seconds=0, healthy_wait_seconds=5)
SHARDS = ("a", "b", "c", "d")


def completion(shard: str, words: int, logprob: float) -> Completion:
    text = " ".join(["w"] * words)
    choice = Choice(0, text, "stop" if words < 512 else "length", logprobs=(logprob,) * words)
    return Completion(text, choice.finish_reason, 3, words, "m", shard, choices=(choice,))


def rollout_with(garbling: str | None, seed: int) -> Any:
    """Healthy answers of 5-200 words with logprobs around -1; ``garbling`` answers 512 unlikely words instead."""
    rng = random.Random(seed)

    async def rollout(shard: Shard, prompt: int) -> Completion:
        if shard.name == garbling:
            return completion(shard.name, 512, -9.0)
        return completion(shard.name, rng.randint(5, 200), rng.gauss(-1.0, 0.3))

    return rollout


def test_the_metric_names_the_detectors_signals() -> None:
    assert QUALITY_SIGNALS == SIGNALS


async def test_a_healthy_fleet_is_never_quarantined() -> None:
    """4 shards x about 500 samples each (about 80 checks): no quarantine, no result flagged."""
    events: list[DispatchEvent] = []
    async with Dispatcher(StaticShardSource(make_shards(*SHARDS)), FAST, observer=events.append) as dispatcher:
        run = dispatcher.run(range(2000), rollout_with(None, 1))
        outcomes = await collect(run)
    assert_accounted(run, outcomes, range(2000))
    assert not [e for e in events if isinstance(e, ShardQuarantined)]
    assert all(isinstance(o, Completed) and o.quality is None for o in outcomes)
    for shard in SHARDS:  # pre-created at 0, so an alert's increase() sees the first one
        for signal in SIGNALS:
            assert dispatcher.metrics.value("rollout_shard_quarantines_total", {"shard": shard, "signal": signal}) == 0


async def test_a_garbling_shard_is_quarantined_with_its_evidence(tmp_path: Path) -> None:
    events: list[DispatchEvent] = []
    ledger = FailureLedger(tmp_path / "ledger.jsonl")
    source = StaticShardSource(make_shards(*SHARDS))
    async with Dispatcher(source, FAST, observer=events.append, ledger=ledger) as dispatcher:
        run = dispatcher.run(range(600), rollout_with("c", 2))
        outcomes = await collect(run)
        ejected = dispatcher.ejected
    assert_accounted(run, outcomes, range(600))
    quarantines = [e for e in events if isinstance(e, ShardQuarantined)]
    assert [q.shard for q in quarantines] == ["c"]
    event = quarantines[0]
    assert event.signal in ("length", "logprob")
    assert event.p_value < event.threshold <= 1e-6
    assert event.peers == ("a", "b", "d")
    assert 32 <= event.evidence["samples"] <= 256
    assert event.evidence["peer_samples"] >= 3 * 32
    assert event.prompt_ids, "the event names the prompts of the shard's recent window"
    assert "c" in ejected
    flagged = [o for o in outcomes if isinstance(o, Completed) and o.quality is not None]
    assert flagged, "the result that completed the evidence comes from the suspect window"
    assert {o.shard for o in flagged} == {"c"}
    assert {o.quality for o in flagged} == {event.signal}
    assert {o.prompt_id for o in flagged} <= set(event.prompt_ids) | {o.prompt_id for o in flagged}
    samples = sum(1 for o in outcomes if isinstance(o, Completed) and o.shard == "c")
    assert samples <= 256, f"c served {samples} prompts before it was taken out"
    assert dispatcher.metrics.value("rollout_shard_quarantines_total", {"shard": "c", "signal": event.signal}) == 1
    assert dispatcher.metrics.value("rollout_shard_quarantines_total", {"shard": "a", "signal": event.signal}) == 0
    (entry,) = FailureLedger.read(tmp_path / "ledger.jsonl")
    assert entry["result"] == "quarantined"
    assert entry["shard"] == "c"
    assert entry["signal"] == event.signal
    assert entry["prompt_ids"] == list(event.prompt_ids)


async def test_the_trainers_mismatch_quarantines_the_shard_that_produced_the_samples() -> None:
    """Outputs look alike; only the trainer's signal (larger on shard b) tells b apart."""
    events: list[DispatchEvent] = []
    rng = random.Random(3)
    async with Dispatcher(StaticShardSource(make_shards(*SHARDS)), FAST, observer=events.append) as dispatcher:
        assert dispatcher.report_sample_quality(12345, 1.0) is False, "an unknown prompt is no evidence"
        run = dispatcher.run(range(800), rollout_with(None, 4))
        async for outcome in run:
            assert isinstance(outcome, Completed)
            shift = 1.0 if outcome.shard == "b" else 0.0  # one standard deviation: a wrong checkpoint's scale
            assert dispatcher.report_sample_quality(outcome.prompt_id, rng.gauss(shift, 1.0))
    quarantines = [e for e in events if isinstance(e, ShardQuarantined)]
    assert [(q.shard, q.signal, q.test) for q in quarantines] == [("b", "mismatch", "shift")]
    assert quarantines[0].evidence["mean"] > quarantines[0].evidence["peer_mean"]


async def test_restored_shard_is_no_longer_flagged() -> None:
    """After its ejection runs out the shard is back on trial and judged on new samples: its results are not
    flagged for the old verdict."""
    events: list[DispatchEvent] = []
    policy = FAST.model_copy(update={"ejection_base_seconds": 0.01, "ejection_max_seconds": 0.01})
    garbling = {"on": True}

    async def rollout(shard: Shard, prompt: int) -> Completion:
        if shard.name == "c" and garbling["on"]:
            return completion("c", 512, -9.0)
        return completion(shard.name, 5 + prompt % 150, -1.0 - (prompt % 7) / 10)

    def observe(event: DispatchEvent) -> None:
        events.append(event)
        if isinstance(event, ShardQuarantined):
            garbling["on"] = False  # the operator fixed it: the shard answers well from now on

    async with Dispatcher(StaticShardSource(make_shards(*SHARDS)), policy, observer=observe) as dispatcher:
        first = await collect(dispatcher.run(range(600), rollout))
        assert [e.shard for e in events if isinstance(e, ShardQuarantined)] == ["c"]
        while "c" in dispatcher.ejected:  # the ejection's timer restores it (0.01 s)
            await collect(dispatcher.run(range(1), rollout))
        later = await collect(dispatcher.run(range(400), rollout))
    assert any(isinstance(e, ShardRestored) and e.shard == "c" for e in events)
    assert any(isinstance(o, Completed) and o.quality for o in first)
    assert all(isinstance(o, Completed) and o.quality is None for o in later)
    assert any(isinstance(o, Completed) and o.shard == "c" for o in later)


async def test_quarantine_can_be_turned_off() -> None:
    events: list[DispatchEvent] = []
    policy = FAST.model_copy(update={"quality_false_positive_rate": 0.0})
    async with Dispatcher(StaticShardSource(make_shards(*SHARDS)), policy, observer=events.append) as dispatcher:
        outcomes = await collect(dispatcher.run(range(400), rollout_with("c", 5)))
        assert dispatcher.report_sample_quality(0, 100.0) is False
    assert not [e for e in events if isinstance(e, ShardQuarantined)]
    assert all(isinstance(o, Completed) and o.quality is None for o in outcomes)


async def test_the_ejection_cap_keeps_an_outlier_in_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """``max_ejection_percent=0`` turns ejection off: the verdict is logged, no quarantine is claimed, nothing is
    flagged (a result is flagged only when its shard was really taken out)."""
    events: list[DispatchEvent] = []
    policy = FAST.model_copy(update={"max_ejection_percent": 0.0})
    async with Dispatcher(StaticShardSource(make_shards(*SHARDS)), policy, observer=events.append) as dispatcher:
        outcomes = await collect(dispatcher.run(range(400), rollout_with("c", 6)))
        assert dispatcher.ejected == frozenset()
    assert not [e for e in events if isinstance(e, ShardQuarantined)]
    assert all(isinstance(o, Completed) and o.quality is None for o in outcomes)
    assert "shard c: outputs unlike its peers'" in caplog.text
