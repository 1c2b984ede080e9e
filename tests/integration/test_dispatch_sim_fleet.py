"""The Dispatcher against real simulated shards (subprocesses on 127.0.0.1) that are killed, hung, flapping.

The dispatcher follows a LocalShardSource (its own HTTP probes) and rolls out through the real GenerationClient.
Faults are triggered by progress (after N completions), never by sleeping. Each test then checks the accounting
invariant, the results' correctness, and that the ``rollout_*`` metrics equal what the run observed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_runtime.dispatch import (
    AttemptEnded,
    Completed,
    DataFailed,
    Dispatcher,
    DispatchEvent,
    DispatchPolicy,
    DispatchRun,
    FailureLedger,
    Outcome,
)
from rollout_runtime.failures import RolloutBatchTooSmall
from rollout_runtime.generation import GenerationClient
from rollout_runtime.health import ProbeSettings
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim import SimFaults, SimFleet, expected_answer
from support.dispatch import assert_accounted, by_kind, collect, collect_until_error

# Fast probes so a dead or hung shard leaves the healthy set within about a second, even on a loaded box.
PROBES = ProbeSettings(period_seconds=0.3, timeout_seconds=0.25, failure_threshold=2, success_threshold=1)
POLICY = DispatchPolicy(
    backoff_initial_seconds=0.05,
    backoff_max_seconds=0.5,
    healthy_wait_seconds=60,
    ejection_base_seconds=2,
    ejection_max_seconds=10,
    max_concurrency=6,
)
MAX_TOKENS = 8


def prompts(count: int) -> list[str]:
    return [f"What is {i} + {i * 3}?" for i in range(count)]


@dataclass
class Progress:
    """Completions counted from the dispatcher's events; tests await thresholds instead of sleeping."""

    successes: int = 0
    by_shard: dict[str, int] = field(default_factory=dict)
    waiters: list[tuple[int, asyncio.Event]] = field(default_factory=list)
    events: list[DispatchEvent] = field(default_factory=list)

    def observe(self, event: DispatchEvent) -> None:
        self.events.append(event)
        if isinstance(event, AttemptEnded) and event.outcome == "success" and event.shard is not None:
            self.successes += 1
            self.by_shard[event.shard] = self.by_shard.get(event.shard, 0) + 1
            for threshold, reached in self.waiters:
                if self.successes >= threshold:
                    reached.set()

    async def reached(self, successes: int) -> None:
        reached = asyncio.Event()
        if self.successes >= successes:
            return
        self.waiters.append((successes, reached))
        await reached.wait()


@dataclass
class Harness:
    fleet: SimFleet
    dispatcher: Dispatcher
    client: GenerationClient
    progress: Progress

    async def busy(self, name: str) -> None:
        """Return once ``name`` has an attempt in flight (checked after each completion)."""
        while self.dispatcher.outstanding().get(name, 0) == 0:
            await self.progress.reached(self.progress.successes + 1)

    async def rollout(self, shard: Shard, prompt: str) -> str:
        completion = await self.client.complete(shard, prompt, max_tokens=MAX_TOKENS)
        return completion.text

    async def run(
        self, batch: list[str], chaos: Callable[[], Coroutine[Any, Any, None]] | None = None
    ) -> tuple[DispatchRun[str, str], list[Outcome[str, str]]]:
        """Run ``batch`` to the end while ``chaos`` runs alongside (it must finish by itself)."""
        run = self.dispatcher.run(batch, self.rollout)
        chaos_task = asyncio.create_task(chaos()) if chaos is not None else None
        try:
            outcomes = await collect(run)
        finally:
            if chaos_task is not None and not chaos_task.done():
                chaos_task.cancel()
            if chaos_task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await chaos_task
        return run, outcomes


@contextlib.asynccontextmanager
async def harness(
    count: int = 3,
    *,
    policy: DispatchPolicy = POLICY,
    faults: dict[str, SimFaults] | None = None,
    max_model_len: int = 4096,
    client_timeout: float = 600,
) -> AsyncIterator[Harness]:
    progress = Progress()
    async with (
        SimFleet(count, max_model_len=max_model_len, faults=faults) as fleet,
        GenerationClient(timeout_seconds=client_timeout, connect_timeout_seconds=5) as client,
        Dispatcher(LocalShardSource(fleet.shards, PROBES), policy, observer=progress.observe, seed=0) as dispatcher,
    ):
        yield Harness(fleet, dispatcher, client, progress)


def assert_correct(outcomes: list[Outcome[str, str]]) -> None:
    for outcome in outcomes:
        if isinstance(outcome, Completed):
            assert outcome.result.strip() == expected_answer(outcome.prompt), outcome


def assert_metrics_match(dispatcher: Dispatcher, run: DispatchRun[Any, Any]) -> None:
    """The rollout_* metrics equal the run's own counters (one run per dispatcher in these tests)."""
    stats = run.stats
    value = dispatcher.metrics.value
    assert value("rollout_attempts_total", {"outcome": "success"}) == stats.successes
    assert value("rollout_attempts_total", {"outcome": "infra_failure"}) == stats.infra_failures
    assert value("rollout_attempts_total", {"outcome": "data_failure"}) == stats.data_failures
    assert value("rollout_attempts_total", {"outcome": "cancelled"}) == stats.cancelled
    assert value("rollout_prompts_total", {"result": "completed"}) == stats.completed
    assert value("rollout_prompts_total", {"result": "data_failed"}) == stats.data_failed
    assert value("rollout_prompts_total", {"result": "skipped"}) == stats.skipped
    assert value("rollout_redispatches_total") == stats.redispatches
    assert value("rollout_redispatch_exhausted_total") == stats.exhausted
    assert value("rollout_in_flight") == 0
    infra_types = [
        s.labels["failure_type"]
        for metric in dispatcher.metrics.registry.collect()
        if metric.name == "rollout_failures"
        for s in metric.samples
        if s.name == "rollout_failures_total" and s.labels["failure_class"] == "infra"
    ]
    infra_total = sum(
        value("rollout_failures_total", {"failure_class": "infra", "failure_type": t}) for t in infra_types
    )
    assert infra_total == stats.infra_failures
    ejections = sum(
        s.value
        for metric in dispatcher.metrics.registry.collect()
        if metric.name == "rollout_ejections"
        for s in metric.samples
        if s.name == "rollout_ejections_total"
    )
    assert ejections == stats.ejections


async def test_a_shard_killed_mid_run_costs_redispatches_not_prompts() -> None:
    batch = prompts(60)
    slow = SimFaults(slow_seconds=0.05)
    async with harness(faults={name: slow for name in ("shard-0", "shard-1", "shard-2")}) as h:

        async def kill_shard_0() -> None:
            await h.progress.reached(10)
            await h.busy("shard-0")
            await h.fleet.kill("shard-0")

        run, outcomes = await h.run(batch, kill_shard_0)
        served_by_dead = h.progress.by_shard.get("shard-0", 0)
        assert "shard-0" not in h.dispatcher.routable
    assert_accounted(run, outcomes, range(len(batch)))
    assert len(by_kind(outcomes)["completed"]) == len(batch)
    assert_correct(outcomes)
    assert served_by_dead < len(batch), "the dead shard cannot have served the whole batch"
    assert run.stats.infra_failures + run.stats.cancelled >= 1, "the kill hit attempts in flight"
    assert_metrics_match(h.dispatcher, run)


async def test_a_hung_shard_costs_probe_detection_time_not_the_attempt_timeout() -> None:
    """SIGSTOP a shard with attempts in flight. Attempts have a 600 s deadline (longer than this test may run), so
    the run can only finish because the probes drop the shard and the dispatcher evicts its attempts."""
    batch = prompts(40)
    policy = POLICY.model_copy(update={"attempt_timeout_seconds": 600, "stall_deadline_seconds": 900})
    slow = SimFaults(slow_seconds=0.2)
    async with harness(policy=policy, faults={name: slow for name in ("shard-0", "shard-1", "shard-2")}) as h:

        async def hang_shard_1() -> None:
            await h.progress.reached(5)
            await h.busy("shard-1")
            h.fleet.hang("shard-1")

        run, outcomes = await h.run(batch, hang_shard_1)
    assert_accounted(run, outcomes, range(len(batch)))
    assert len(by_kind(outcomes)["completed"]) == len(batch)
    assert_correct(outcomes)
    assert run.stats.cancelled >= 1, "the hung shard's attempts must have been evicted"
    assert (
        h.dispatcher.metrics.value(
            "rollout_failures_total", {"failure_class": "infra", "failure_type": "RolloutTimeout"}
        )
        == 0
    )
    assert_metrics_match(h.dispatcher, run)


async def test_a_flapping_shard_never_loses_or_duplicates_a_prompt() -> None:
    batch = prompts(120)
    slow = SimFaults(slow_seconds=0.05)
    faults = {"shard-0": slow, "shard-1": slow, "shard-2": SimFaults(slow_seconds=0.05, flap_seconds=0.4)}
    async with harness(faults=faults) as h:
        run, outcomes = await h.run(batch)
    assert_accounted(run, outcomes, range(len(batch)))
    assert len(by_kind(outcomes)["completed"]) == len(batch)
    assert_correct(outcomes)
    assert run.stats.infra_failures + run.stats.cancelled >= 1, "the flaps cost attempts"
    assert_metrics_match(h.dispatcher, run)


async def test_all_shards_down_then_one_back_completes_the_batch() -> None:
    """Until the probes notice (about 0.6 s here), attempts fail fast against dead shards and spend infra budget;
    the backoff (>= 1.5 s over four retries) outlasts that window, then prompts wait for a healthy shard."""
    batch = prompts(30)
    slow = SimFaults(slow_seconds=0.05)
    policy = POLICY.model_copy(update={"backoff_initial_seconds": 0.2, "backoff_max_seconds": 2})
    async with harness(policy=policy, faults={name: slow for name in ("shard-0", "shard-1", "shard-2")}) as h:

        async def outage() -> None:
            await h.progress.reached(5)
            await h.busy("shard-0")
            await asyncio.gather(*(h.fleet.kill(name) for name in h.fleet.names))
            await h.fleet.restart("shard-2", faults=slow)

        run, outcomes = await h.run(batch, outage)
        survivors = h.progress.by_shard
    assert_accounted(run, outcomes, range(len(batch)))
    assert len(by_kind(outcomes)["completed"]) == len(batch)
    assert_correct(outcomes)
    assert survivors.get("shard-2", 0) >= 1
    assert run.stats.infra_failures >= 1
    assert_metrics_match(h.dispatcher, run)


async def test_over_long_prompts_are_data_failed_with_vllms_reason_and_ledgered(tmp_path: Path) -> None:
    long_prompt = " ".join(["word"] * 80)  # 80 tokens + 8 to generate > max_model_len 64
    batch = prompts(12)
    batch[3] = long_prompt
    batch[7] = long_prompt + " again"
    ledger = tmp_path / "ledger.jsonl"
    policy = POLICY.model_copy(
        update={"failure_ledger_path": ledger, "max_skipped_prompts": 2, "min_step_batch_fraction": 0.8}
    )
    async with harness(policy=policy, max_model_len=64) as h:
        run, outcomes = await h.run(batch)
    assert_accounted(run, outcomes, range(len(batch)))
    kinds = by_kind(outcomes)
    assert sorted(o.prompt_id for o in kinds["data_failed"]) == [3, 7]
    for failed in kinds["data_failed"]:
        assert isinstance(failed, DataFailed)
        assert failed.failure_type == "RolloutDataFailure"
        assert "This model's maximum context length is 64 tokens" in failed.reason
        # The data budget of 2, plus an attempt for each refusal from a shard that had served nothing yet while others
        # had (blame does not let such a refusal alone convict a prompt).
        assert POLICY.max_data_attempts <= failed.attempts <= len(failed.shards) + 1
        assert len(set(failed.shards)) >= 2, "the data retry must go to another shard"
    assert len(kinds["completed"]) == 10
    assert_correct(outcomes)
    entries = FailureLedger.read(ledger)
    assert sorted(e["prompt_id"] for e in entries) == [3, 7]  # type: ignore[type-var]
    assert all("maximum context length is 64 tokens" in str(e["reason"]) for e in entries)
    data_attempts = sum(failed.attempts for failed in kinds["data_failed"])
    assert h.dispatcher.metrics.value("rollout_attempts_total", {"outcome": "data_failure"}) == data_attempts
    assert_metrics_match(h.dispatcher, run)


# -- NeMo-RL's drop semantics against real shard processes ---------------------------------------------------------

LONG = " ".join(["word"] * 80)  # 80 tokens + 8 to generate > max_model_len 64: vLLM's context-length 400, DATA


async def test_shrink_ends_the_run_once_fewer_than_the_batch_floor_can_complete() -> None:
    """Two over-long prompts of 10 at min_step_batch_fraction 0.9 (floor 9): the first shrinks the batch, the second
    ends the run with RolloutBatchTooSmall, every prompt accounted for."""
    batch = prompts(10)
    batch[2], batch[6] = LONG, LONG + " again"
    policy = POLICY.model_copy(update={"max_skipped_prompts": 5, "min_step_batch_fraction": 0.9})
    async with harness(policy=policy, max_model_len=64) as h:
        run = h.dispatcher.run(batch, h.rollout)
        outcomes, error = await collect_until_error(run)
    assert isinstance(error, RolloutBatchTooSmall), error
    assert "lost 2 of 10" in str(error)
    assert_accounted(run, outcomes, range(10))
    [failed] = by_kind(outcomes)["data_failed"]
    assert failed.prompt_id in (2, 6)
    assert {2, 6} - {failed.prompt_id} <= set(run.aborted_ids())
    assert_correct(outcomes)


async def test_replace_keeps_the_batch_size_with_prompts_from_the_reserve() -> None:
    """Two over-long prompts of 10, a reserve whose first prompt is over-long too: each lost position is refilled
    (one of them twice), the run completes 10 prompts, and only the reserve prompts drawn are submitted."""
    batch = prompts(10)
    batch[3], batch[7] = LONG, LONG + " again"
    reserve = [LONG + " and again", "What is 100 + 300?", "What is 200 + 600?", "What is 5 + 15?"]
    policy = POLICY.model_copy(
        update={
            "max_skipped_prompts": 3,
            "min_step_batch_fraction": 1.0,
            "on_dropped_prompt": "replace",
            "max_replacement_attempts": 2,
        }
    )
    async with harness(policy=policy, max_model_len=64) as h:
        run = h.dispatcher.run(batch, h.rollout, reserve=reserve)
        outcomes = await collect(run)
    kinds = by_kind(outcomes)
    assert len(kinds["completed"]) == 10, "the batch keeps its size"
    assert sorted(o.prompt_id for o in kinds["data_failed"]) == [3, 7, 10], "reserve ids continue the positions"
    assert run.stats.submitted == 13, "the fourth reserve prompt was never needed, so never submitted"
    assert {o.prompt for o in kinds["completed"]} >= set(reserve[1:3])
    assert_accounted(run, outcomes, range(13))
    assert_correct(outcomes)
    assert_metrics_match(h.dispatcher, run)
