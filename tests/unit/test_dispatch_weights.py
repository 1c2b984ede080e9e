"""The dispatcher's stale gating: an answer from weights outside max_weights_lag is redispatched, never committed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout_runtime.dispatch import Completed, Dispatcher, DispatchPolicy, FailureLedger
from rollout_runtime.dispatch.ledger import stale_by_version
from rollout_runtime.failures import RolloutTerminalDataFailure
from rollout_runtime.shards import Shard, StaticShardSource
from support.dispatch import assert_accounted, collect, make_shards

FAST = DispatchPolicy(backoff_initial_seconds=0, backoff_max_seconds=0, healthy_wait_seconds=5)


class Versions:
    """A WeightsView whose versions the test sets."""

    def __init__(self, policy: int | None, versions: dict[str, int | None]) -> None:
        self.policy = policy
        self.versions = versions

    @property
    def policy_version(self) -> int | None:
        return self.policy

    def version_of(self, shard: str) -> int | None:
        return self.versions.get(shard)

    def stale_shards(self) -> Mapping[str, bool]:
        return {name: version is None for name, version in self.versions.items()}


async def test_answers_from_a_lagging_shard_are_redispatched_and_never_committed() -> None:
    weights = Versions(2, {"a": 1, "b": 2})
    answered: list[str] = []

    async def rollout(shard: Shard, prompt: Any) -> str:
        answered.append(shard.name)
        return f"{prompt}@{shard.name}"

    async with Dispatcher(StaticShardSource(make_shards("a", "b")), FAST, weights=weights) as dispatcher:
        run = dispatcher.run(range(20), rollout)
        outcomes = await collect(run)
    assert_accounted(run, outcomes, range(20))
    assert "a" in answered, "the lagging shard was never tried: the gate was not exercised"
    completed = [o for o in outcomes if isinstance(o, Completed)]
    assert len(completed) == 20
    assert {(o.shard, o.weights_version) for o in completed} == {("b", 2)}
    assert run.stats.stale == answered.count("a")
    assert run.stats.committed_by_version == {2: 20}
    assert dispatcher.metrics.value("rollout_committed_results_total", {"lag": "0"}) == 20
    assert dispatcher.metrics.value("rollout_attempts_total", {"outcome": "stale"}) == run.stats.stale
    assert dispatcher.metrics.value("rollout_stale_shards") == 0


async def test_weights_changing_during_an_attempt_is_not_committed() -> None:
    weights = Versions(3, {"a": 3})
    calls = 0

    async def rollout(shard: Shard, prompt: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            weights.versions["a"] = None  # restarted mid-attempt: stale
            weights.versions["a"] = 3  # and refit again before the answer came back
            weights.versions["a"] = 4
            weights.policy = 4
        return calls

    async with Dispatcher(StaticShardSource(make_shards("a")), FAST, weights=weights) as dispatcher:
        outcomes = await collect(dispatcher.run([0], rollout))
    assert calls == 2
    assert isinstance(outcomes[0], Completed)
    assert outcomes[0].weights_version == 4


async def test_without_a_published_policy_every_answer_commits_unstamped() -> None:
    weights = Versions(None, {"a": None})

    async def rollout(shard: Shard, prompt: Any) -> int:
        return 1

    async with Dispatcher(StaticShardSource(make_shards("a")), FAST, weights=weights) as dispatcher:
        run = dispatcher.run(range(3), rollout)
        outcomes = await collect(run)
    assert all(isinstance(o, Completed) and o.weights_version is None for o in outcomes)
    assert run.stats.stale == 0
    assert run.stats.committed_by_version == {None: 3}
    assert dispatcher.metrics.value("rollout_committed_results_total", {"lag": "unknown"}) == 3
    assert dispatcher.metrics.value("rollout_shard_stale", {"shard": "a"}) == 1


async def test_the_ledger_counts_a_failed_prompts_stale_answers_by_version(tmp_path: Path) -> None:
    """A prompt whose only answer came from lagging weights, then failed for its data: its ledger line says which
    policy versions answered it, so a failure is never mistaken for a result of the current policy."""
    weights = Versions(2, {"a": 1})
    calls = 0

    async def rollout(shard: Shard, prompt: Any) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            return "an off-policy answer"
        raise RolloutTerminalDataFailure("the prompt is malformed")

    ledger = tmp_path / "failures.jsonl"
    policy = FAST.model_copy(update={"failure_ledger_path": ledger})
    async with Dispatcher(StaticShardSource(make_shards("a")), policy, weights=weights) as dispatcher:
        run = dispatcher.run(["p"], rollout, drop_rules=False)  # reported, not a training step's loss
        outcomes = await collect(run)
    assert_accounted(run, outcomes, range(1))
    assert run.stats.stale == 1, "the first answer was not gated: the fault did not hit"
    [entry] = FailureLedger.read(ledger)
    assert entry["result"] == "data_failed"
    assert entry["stale_by_version"] == {"1": 1}


def test_stale_counts_are_ledgered_in_version_order_with_unknown_last() -> None:
    assert stale_by_version({3: 1, None: 2, 1: 4}) == {"1": 4, "3": 1, "unknown": 2}
