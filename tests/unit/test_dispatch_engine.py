"""The Dispatcher against in-process fakes: redispatch, budgets, eviction, waiting, stalls, accounting, cleanup."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rollout_runtime.dispatch import (
    AttemptEnded,
    Completed,
    DataFailed,
    Dispatcher,
    DispatchEvent,
    DispatchPolicy,
    FailureLedger,
    HealthyShardsChanged,
    ShardEjected,
    ShardRestored,
    Skipped,
    StallDetected,
)
from rollout_runtime.dispatch.rotation import TURN_BUDGET, Rotation
from rollout_runtime.failures import (
    GenerationUnavailable,
    GymTransportError,
    NoHealthyShards,
    RolloutDataFailure,
    RolloutRedispatchExhausted,
    RolloutStall,
    RolloutTerminalDataFailure,
)
from rollout_runtime.shards import Shard, StaticShardSource
from support.deadlines import within
from support.dispatch import (
    AttemptLog,
    ControlledSource,
    assert_accounted,
    by_kind,
    collect,
    collect_until_error,
    echo_rollout,
    make_shard,
    make_shards,
)

FAST = DispatchPolicy(backoff_initial_seconds=0, backoff_max_seconds=0, healthy_wait_seconds=5)
REPORTING = DispatchPolicy(
    backoff_initial_seconds=0,
    backoff_max_seconds=0,
    healthy_wait_seconds=5,
    max_skipped_prompts=1000,
    max_consecutive_dropped_prompts=1000,
    min_step_batch_fraction=0.01,
)
"""FAST, but every prompt given up on is reported and the run goes on while one prompt completes (the drop rules
have their own tests; a run none of whose prompts completes always fails, as NeMo-RL's empty step does)."""


def value(dispatcher: Dispatcher, name: str, **labels: str) -> float:
    return dispatcher.metrics.value(name, labels)


async def test_every_prompt_completes_once_on_a_healthy_fleet() -> None:
    log = AttemptLog()
    async with Dispatcher(StaticShardSource(make_shards("a", "b", "c")), FAST) as dispatcher:
        run = dispatcher.run(range(30), echo_rollout(log))
        outcomes = await collect(run)
    assert_accounted(run, outcomes, range(30))
    assert all(isinstance(o, Completed) and o.attempts == 1 for o in outcomes)
    assert sorted(o.result[0] for o in outcomes if isinstance(o, Completed)) == list(range(30))
    assert {shard for _, shard in log.calls} == {"a", "b", "c"}
    assert value(dispatcher, "rollout_attempts_total", outcome="success") == 30
    assert value(dispatcher, "rollout_prompts_total", result="completed") == 30
    assert value(dispatcher, "rollout_in_flight") == 0


async def test_infra_failure_redispatches_to_another_shard_and_ejects_the_failing_one() -> None:
    log = AttemptLog()

    async def rollout(shard: Shard, prompt: int) -> str:
        log.calls.append((prompt, shard.name))
        if shard.name == "bad":
            raise GenerationUnavailable("shard bad: connection refused")
        return shard.name

    events: list[DispatchEvent] = []
    source = StaticShardSource(make_shards("bad", "good1", "good2"))
    async with Dispatcher(source, FAST, observer=events.append) as dispatcher:
        run = dispatcher.run(range(6), rollout)
        outcomes = await collect(run)
        assert "bad" in dispatcher.ejected
    assert_accounted(run, outcomes, range(6))
    assert all(isinstance(o, Completed) and o.result != "bad" for o in outcomes)
    for prompt in range(6):
        shards = log.shards_for(prompt)
        assert shards.count("bad") <= 1, "a prompt went back to the shard that failed it"
    assert [e.shard for e in events if isinstance(e, ShardEjected)] == ["bad"]
    assert value(dispatcher, "rollout_ejections_total", shard="bad") == 1
    failures = value(dispatcher, "rollout_failures_total", failure_class="infra", failure_type="GenerationUnavailable")
    assert failures == run.stats.infra_failures >= 1
    assert value(dispatcher, "rollout_redispatches_total") == run.stats.redispatches == failures


@pytest.mark.looptime
async def test_a_retry_never_goes_back_to_the_shard_that_just_failed_even_when_round_robin_points_at_it() -> None:
    """Three shards, all already tried by the prompt, and the rotation's next pick is the shard that failed it last:
    only the steering rule keeps the retry off it. (With two shards round-robin alone alternates: it proves nothing.)

    One worker, ejection off (every shard stays routable), backoff on a timer: "p" fails on s1; "q" takes the next pick
    (s2) while p backs off; p then fails on s0 and s2; the rotation now starts at s2, the shard that just failed.
    """
    log = AttemptLog()
    failures_left = {"p": 3}

    async def rollout(shard: Shard, prompt: str) -> str:
        log.calls.append((prompt, shard.name))
        if failures_left.get(prompt, 0):
            failures_left[prompt] -= 1
            raise GenerationUnavailable(f"shard {shard.name}: 503", status=503)
        return shard.name

    policy = DispatchPolicy(max_concurrency=1, max_ejection_percent=0, backoff_initial_seconds=1, backoff_max_seconds=1)
    async with Dispatcher(StaticShardSource(make_shards("s0", "s1", "s2")), policy) as dispatcher:
        outcomes = await collect(dispatcher.run(["p", "q"], rollout))
    assert all(isinstance(o, Completed) for o in outcomes)
    attempts = log.shards_for("p")
    assert len(attempts) == 4
    assert set(attempts[:3]) == {"s0", "s1", "s2"}, "the case needs every shard tried before the last retry"
    assert all(a != b for a, b in itertools.pairwise(attempts)), f"a retry went back to its failed shard: {attempts}"


async def test_data_failure_is_retried_once_elsewhere_then_reported_with_reason_and_ledgered(tmp_path: Path) -> None:
    log = AttemptLog()
    ledger = tmp_path / "ledger" / "failures.jsonl"

    async def rollout(shard: Shard, prompt: str) -> str:
        log.calls.append((prompt, shard.name))
        if prompt == "too long":
            raise RolloutDataFailure("This model's maximum context length is 16 tokens. However, you requested 40")
        return prompt.upper()

    policy = REPORTING.model_copy(update={"failure_ledger_path": ledger})
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), policy) as dispatcher:
        run = dispatcher.run(["ok", "too long", "fine"], rollout, prompt_ids=["p0", "p1", "p2"])
        outcomes = await collect(run)
    assert_accounted(run, outcomes, ["p0", "p1", "p2"])
    kinds = by_kind(outcomes)
    assert sorted(o.result for o in kinds["completed"]) == ["FINE", "OK"]
    [failed] = kinds["data_failed"]
    assert isinstance(failed, DataFailed)
    assert (failed.prompt_id, failed.failure_class.value, failed.failure_type) == ("p1", "data", "RolloutDataFailure")
    assert "maximum context length is 16 tokens" in failed.reason
    assert failed.attempts == 2
    assert sorted(log.shards_for("too long")) == ["a", "b"], "the data retry must land on another shard"
    [entry] = FailureLedger.read(ledger)
    assert entry["prompt_id"] == "p1"
    assert entry["result"] == "data_failed"
    assert entry["failure_type"] == "RolloutDataFailure"
    assert "maximum context length" in str(entry["reason"])
    assert entry["attempts"] == 2
    assert sorted(str(s) for s in entry["shards"]) == ["a", "b"]  # type: ignore[attr-defined]
    assert value(dispatcher, "rollout_prompts_total", result="data_failed") == 1
    assert value(dispatcher, "rollout_attempts_total", outcome="data_failure") == 2
    assert dispatcher.ejected == frozenset(), "a data failure says nothing about the shard"


async def test_terminal_data_failure_is_not_retried() -> None:
    log = AttemptLog()

    async def rollout(shard: Shard, prompt: int) -> int:
        log.calls.append((prompt, shard.name))
        if prompt == 0:
            return prompt
        raise RolloutTerminalDataFailure("environment rejected the task: unknown tool")

    async with Dispatcher(StaticShardSource(make_shards("a", "b")), REPORTING) as dispatcher:
        run = dispatcher.run([7, 0], rollout)
        [outcome] = by_kind(await collect(run))["data_failed"]
    assert isinstance(outcome, DataFailed)
    assert outcome.attempts == 1
    assert "unknown tool" in outcome.reason
    assert len(log.shards_for(7)) == 1


async def test_unknown_exception_is_data_and_never_a_result() -> None:
    async def rollout(shard: Shard, prompt: int) -> int:
        if prompt == 0:
            return prompt
        raise KeyError("reward")

    async with Dispatcher(StaticShardSource(make_shards("a", "b")), REPORTING) as dispatcher:
        run = dispatcher.run([1, 2, 0], rollout)
        outcomes = await collect(run)
    assert_accounted(run, outcomes, [0, 1, 2])
    failed = by_kind(outcomes)["data_failed"]
    assert sorted(o.prompt_id for o in failed) == [0, 1]
    assert all(isinstance(o, DataFailed) and o.failure_type == "KeyError" for o in failed)


async def test_exhausted_infra_budget_raises_after_delivering_finished_outcomes() -> None:
    async def rollout(shard: Shard, prompt: int) -> int:
        if prompt == 0:
            raise ConnectionResetError("peer reset")
        return prompt

    policy = FAST.model_copy(update={"max_infra_attempts": 3, "max_concurrency": 1})
    async with Dispatcher(StaticShardSource(make_shards("a", "b", "c")), policy) as dispatcher:
        run = dispatcher.run(range(4), rollout)
        outcomes, error = await collect_until_error(run)
    assert isinstance(error, RolloutRedispatchExhausted)
    assert "prompt 0" in str(error)
    assert isinstance(error.__cause__, ConnectionResetError)
    assert_accounted(run, outcomes, range(4))
    assert 0 in run.aborted_ids()
    assert run.stats.exhausted == 1
    assert value(dispatcher, "rollout_redispatch_exhausted_total") == 1
    assert value(dispatcher, "rollout_attempts_total", outcome="infra_failure") == 3


async def test_drop_budget_reports_exhausted_prompts_as_skipped_and_the_run_continues(tmp_path: Path) -> None:
    """Infra-exhausted prompts are allowed by max_consecutive_dropped_prompts (before issue 13: max_skipped_prompts,
    which now counts data-failed prompts, as NeMo-RL's does)."""

    async def rollout(shard: Shard, prompt: int) -> int:
        if prompt in (1, 3):
            raise TimeoutError("read timed out")
        return prompt

    policy = FAST.model_copy(
        update={
            "max_infra_attempts": 2,
            "max_consecutive_dropped_prompts": 2,
            "min_step_batch_fraction": 0.6,
            "failure_ledger_path": tmp_path / "l.jsonl",
        }
    )
    async with Dispatcher(StaticShardSource(make_shards("a", "b", "c")), policy) as dispatcher:
        run = dispatcher.run(range(5), rollout)
        outcomes = await collect(run)
    assert_accounted(run, outcomes, range(5))
    skipped = by_kind(outcomes)["skipped"]
    assert sorted(o.prompt_id for o in skipped) == [1, 3]
    assert all(isinstance(o, Skipped) and o.attempts == 2 and o.failure_type == "TimeoutError" for o in skipped)
    assert {e["result"] for e in FailureLedger.read(tmp_path / "l.jsonl")} == {"skipped"}
    assert value(dispatcher, "rollout_prompts_total", result="skipped") == 2


@pytest.mark.looptime
async def test_infra_retries_back_off_exponentially_within_bounds() -> None:
    loop = asyncio.get_running_loop()
    started: list[float] = []

    async def rollout(shard: Shard, prompt: int) -> int:
        started.append(loop.time())
        if len(started) < 5:
            raise ConnectionRefusedError("refused")
        return prompt

    policy = DispatchPolicy(backoff_initial_seconds=1, backoff_max_seconds=4, backoff_jitter=0.5)
    async with Dispatcher(StaticShardSource(make_shards("a")), policy, seed=7) as dispatcher:  # nowhere else to go
        [outcome] = await collect(dispatcher.run([0], rollout))
    assert isinstance(outcome, Completed)
    assert outcome.attempts == 5
    gaps = [b - a for a, b in itertools.pairwise(started)]
    for gap, nominal in zip(gaps, [1, 2, 4, 4], strict=True):
        assert nominal * 0.5 - 1e-6 <= gap <= nominal + 1e-6


@pytest.mark.looptime
async def test_an_infra_retry_that_can_go_to_another_shard_goes_at_once() -> None:
    loop = asyncio.get_running_loop()
    started: list[tuple[str, float]] = []

    async def rollout(shard: Shard, prompt: int) -> int:
        started.append((shard.name, loop.time()))
        if len(started) < 3:
            raise ConnectionRefusedError("refused")
        return prompt

    policy = DispatchPolicy(backoff_initial_seconds=1, backoff_max_seconds=4, max_ejection_percent=100)
    async with Dispatcher(StaticShardSource(make_shards("a", "b", "c")), policy) as dispatcher:
        [outcome] = await collect(dispatcher.run([0], rollout))
    assert isinstance(outcome, Completed)
    assert sorted(name for name, _ in started) == ["a", "b", "c"], "each failure ejected its shard; the retry moved on"
    assert [t for _, t in started] == [started[0][1]] * 3, "no backoff while another shard could take the retry"


@pytest.mark.looptime
async def test_attempt_timeout_is_an_infra_rollout_timeout() -> None:
    calls: list[str] = []

    async def rollout(shard: Shard, prompt: int) -> str:
        calls.append(shard.name)
        if len(calls) == 1:
            await asyncio.Event().wait()  # hangs until the attempt deadline cancels it
        return shard.name

    policy = FAST.model_copy(update={"attempt_timeout_seconds": 10})
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), policy) as dispatcher:
        [outcome] = await collect(dispatcher.run([0], rollout))
    assert isinstance(outcome, Completed)
    assert outcome.attempts == 2
    assert outcome.shard != calls[0]
    assert value(dispatcher, "rollout_failures_total", failure_class="infra", failure_type="RolloutTimeout") == 1


@pytest.mark.looptime  # a regression hangs on the hung shard: the run's deadline then fails it at once
async def test_attempts_on_a_shard_that_leaves_the_healthy_set_are_redispatched_without_budget() -> None:
    source = ControlledSource(make_shards("hung", "ok"))
    entered_hung = asyncio.Event()

    async def rollout(shard: Shard, prompt: int) -> str:
        if shard.name == "hung":
            entered_hung.set()
            await asyncio.Event().wait()  # a hung shard: only eviction gets us out
        return shard.name

    # One infra attempt only: an eviction charged to the infra budget would exhaust it.
    policy = FAST.model_copy(update={"max_infra_attempts": 1})
    async with Dispatcher(source, policy) as dispatcher:
        run = dispatcher.run(range(4), rollout)

        async def drop_hung_shard() -> None:
            await entered_hung.wait()
            source.publish(make_shards("ok"))

        dropper = asyncio.create_task(drop_hung_shard())
        outcomes = await collect(run)
        await dropper
    assert_accounted(run, outcomes, range(4))
    assert all(isinstance(o, Completed) and o.result == "ok" for o in outcomes)
    assert run.stats.cancelled >= 1
    assert run.stats.infra_failures == 0
    assert value(dispatcher, "rollout_attempts_total", outcome="cancelled") == run.stats.cancelled


@pytest.mark.looptime
async def test_waits_for_a_healthy_shard_then_dispatches() -> None:
    source = ControlledSource([])
    loop = asyncio.get_running_loop()
    loop.call_later(3, source.publish, make_shards("late"))
    policy = FAST.model_copy(update={"healthy_wait_seconds": 10})
    async with Dispatcher(source, policy) as dispatcher:
        outcomes = await collect(dispatcher.run(range(3), echo_rollout()))
    assert [o.shard for o in outcomes if isinstance(o, Completed)] == ["late"] * 3
    assert value(dispatcher, "rollout_attempts_total", outcome="infra_failure") == 0


@pytest.mark.looptime
async def test_no_healthy_shard_within_the_wait_ends_the_run_at_once() -> None:
    """One healthy wait, not the infra budget of every prompt: the run fails with one NoHealthyShards attempt."""
    policy = DispatchPolicy(healthy_wait_seconds=5, max_infra_attempts=2, backoff_initial_seconds=1)
    async with Dispatcher(ControlledSource([]), policy) as dispatcher:
        run = dispatcher.run(["p", "q", "r"], echo_rollout())
        outcomes, error = await collect_until_error(run)
    assert outcomes == []
    assert isinstance(error, RolloutRedispatchExhausted)
    assert isinstance(error.__cause__, NoHealthyShards)
    assert "no routable shard for 5s" in str(error)
    assert value(dispatcher, "rollout_failures_total", failure_class="infra", failure_type="NoHealthyShards") == 1
    assert (run.stats.aborted, run.stats.submitted) == (3, 3)


@pytest.mark.looptime
async def test_stall_abort_raises_rollout_stall_after_the_deadline() -> None:
    async def rollout(shard: Shard, prompt: int) -> int:
        if prompt == 1:
            await asyncio.Event().wait()
        return prompt

    policy = DispatchPolicy(stall_deadline_seconds=60, stall_check_seconds=10, stall_action="abort")
    async with Dispatcher(StaticShardSource(make_shards("a")), policy) as dispatcher:
        run = dispatcher.run([0, 1], rollout)
        outcomes, error = await collect_until_error(run)
    assert isinstance(error, RolloutStall)
    assert [o.prompt_id for o in outcomes] == [0]
    assert run.aborted_ids() == [1]
    assert value(dispatcher, "rollout_stalls_total", action="abort") == 1
    assert_accounted(run, outcomes, [0, 1])


@pytest.mark.looptime
async def test_stall_warn_counts_once_per_episode_and_the_run_goes_on() -> None:
    release = asyncio.Event()
    events: list[DispatchEvent] = []

    def observe(event: DispatchEvent) -> None:
        events.append(event)
        if isinstance(event, StallDetected):
            asyncio.get_running_loop().call_later(100, release.set)  # stalled well past several checks

    async def rollout(shard: Shard, prompt: int) -> int:
        await release.wait()
        return prompt

    policy = DispatchPolicy(stall_deadline_seconds=60, stall_check_seconds=10, stall_action="warn")
    async with Dispatcher(StaticShardSource(make_shards("a")), policy, observer=observe) as dispatcher:
        run = dispatcher.run([0], rollout)
        outcomes = await collect(run)
    assert [type(o) for o in outcomes] == [Completed]
    assert sum(isinstance(e, StallDetected) for e in events) == 1
    assert value(dispatcher, "rollout_stalls_total", action="warn") == 1


@pytest.mark.looptime
async def test_ejected_shard_returns_after_its_ejection_time() -> None:
    events: list[DispatchEvent] = []
    failed_once: set[str] = set()

    async def rollout(shard: Shard, prompt: int) -> str:
        if shard.name == "flaky" and not failed_once:
            failed_once.add(shard.name)
            raise GenerationUnavailable("503")
        return shard.name

    policy = FAST.model_copy(update={"ejection_base_seconds": 30})
    async with Dispatcher(StaticShardSource(make_shards("flaky", "ok")), policy, observer=events.append) as d:
        await collect(d.run([0, 1], rollout))
        assert d.ejected == {"flaky"}
        assert d.routable == ("ok",)
        await asyncio.sleep(30)
        assert d.ejected == frozenset()
        assert set(d.routable) == {"flaky", "ok"}
    assert ShardRestored("flaky", "expired") in events
    assert value(d, "rollout_healthy_shards") == 2


async def test_probe_success_after_ejection_restores_the_shard() -> None:
    source = ControlledSource(make_shards("flaky", "ok"))

    async def rollout(shard: Shard, prompt: int) -> str:
        if shard.name == "flaky":
            raise GenerationUnavailable("503")
        return shard.name

    restored = asyncio.Event()

    def observe(event: DispatchEvent) -> None:
        if event == ShardRestored("flaky", "probe"):
            restored.set()

    async with Dispatcher(source, FAST, observer=observe) as d:
        await collect(d.run([0, 1], rollout))
        assert d.ejected == {"flaky"}
        source.publish(make_shards("flaky", "ok"), probe_ok_at={"flaky": d.clock.wall() + 1})
        await within(restored.wait(), "the ejected shard to be restored by its probe")
        assert d.ejected == frozenset()


async def test_panic_rule_never_ejects_the_last_healthy_shard() -> None:
    attempts = 0

    async def rollout(shard: Shard, prompt: int) -> str:
        nonlocal attempts
        attempts += 1
        if attempts <= 2:
            raise GenerationUnavailable("503")
        return shard.name

    async with Dispatcher(StaticShardSource(make_shards("only")), FAST) as d:
        [outcome] = await collect(d.run([0], rollout))
        assert d.ejected == frozenset()
        assert d.routable == ("only",)
    assert isinstance(outcome, Completed)
    assert value(d, "rollout_ejections_total", shard="only") == 0


@pytest.mark.looptime
async def test_a_failing_shard_the_panic_rule_keeps_is_held_not_handed_every_attempt() -> None:
    """Three shards, two answering 503 at once, the panic rule (50 %) ejecting only one: the other stays in rotation
    but is held for the backoff, doubling, so it cannot draw every fresh prompt by failing faster than the good shard
    serves (least-outstanding's black hole)."""
    attempts: Counter[str] = Counter()

    async def rollout(shard: Shard, prompt: int) -> str:
        attempts[shard.name] += 1
        if shard.name != "good":
            raise GenerationUnavailable("503 Service Unavailable")
        await asyncio.sleep(0.1)
        return shard.name

    policy = REPORTING.model_copy(
        update={
            "backoff_initial_seconds": 1.0,
            "backoff_max_seconds": 8.0,
            "backoff_jitter": 0.0,
            "ejection_base_seconds": 60.0,
            "max_concurrency": 4,
        }
    )
    async with Dispatcher(StaticShardSource(make_shards("bad1", "bad2", "good")), policy) as d:
        outcomes = await collect(d.run(range(40), rollout))
        assert len(d.ejected) == 1, "the panic rule ejects one of three"
    assert [type(o) for o in outcomes] == [Completed] * 40
    held = next(name for name in ("bad1", "bad2") if attempts[name] > 1 or name not in d.ejected)
    # 40 prompts at 4 x 0.1 s take ~1 s on the good shard: the held shard gets its trials after 1 s, 1 + 2 s, ...
    assert attempts[held] <= 3, f"the held shard drew {attempts[held]} attempts"
    assert attempts["good"] == 40
    assert value(d, "rollout_shard_holds_total", shard=held) >= 1


@pytest.mark.looptime
async def test_a_restored_shard_takes_one_attempt_while_it_could_still_be_failing_then_doubles() -> None:
    """After its ejection ends, a shard with nothing in flight is the least loaded by far. On trial it gets one attempt
    until that one has outlived the failure that took it out (4 x its 0.05 s), then twice as many each time again:
    well before its first success, but never a burst while it might still be failing."""
    in_flight: Counter[str] = Counter()
    loop = asyncio.get_running_loop()
    peaks: list[tuple[float, int]] = []
    served = asyncio.Event()

    async def rollout(shard: Shard, prompt: int) -> str:
        if shard.name == "flaky" and loop.time() < 0.5:  # a 503 burst: its first answer ejects it
            await asyncio.sleep(0.05)
            raise GenerationUnavailable("503 Service Unavailable")
        in_flight[shard.name] += 1
        if shard.name == "flaky" and not served.is_set():
            peaks.append((loop.time(), in_flight["flaky"]))
        try:
            await asyncio.sleep(5 if shard.name == "flaky" else 0.1)
        finally:
            in_flight[shard.name] -= 1
        if shard.name == "flaky":
            served.set()
        return shard.name

    policy = REPORTING.model_copy(update={"ejection_base_seconds": 1.0, "max_concurrency": 16})
    async with Dispatcher(StaticShardSource(make_shards("flaky", "steady")), policy) as d:
        outcomes = await collect(d.run(range(400), rollout))
    assert [type(o) for o in outcomes] == [Completed] * 400
    assert value(d, "rollout_ejections_total", shard="flaky") == 1, "the first failure ejected it"
    assert served.is_set()
    first = peaks[0][0]
    assert [n for t, n in peaks if t - first < 0.15] == [1], "one attempt until the first outlived the failure (0.2 s)"
    assert max(n for t, n in peaks if t - first < 0.35) == 2, "then two"
    assert max(n for t, n in peaks if t - first < 0.55) == 4, "then four"
    assert max(n for _, n in peaks) >= 8, "and more, all before its first success (5 s)"


async def test_environment_transport_failures_do_not_eject_the_generation_shard() -> None:
    """Neither a GymTransportError nor one in the cause chain (the second attempt) ejects the generation shard."""
    seen: list[str] = []

    async def rollout(shard: Shard, prompt: int) -> str:
        seen.append(shard.name)
        if len(seen) == 1:
            raise GymTransportError("environment server reset the connection")
        if len(seen) == 2:
            raise RuntimeError("episode failed") from GymTransportError("environment server timed out")
        return shard.name

    async with Dispatcher(StaticShardSource(make_shards("a", "b")), FAST) as d:
        [outcome] = await collect(d.run([0], rollout))
        assert d.ejected == frozenset()
    assert isinstance(outcome, Completed)


async def test_weighted_least_outstanding_spreads_in_flight_work_by_weight() -> None:
    gate = asyncio.Event()
    all_started = asyncio.Event()
    started = 0

    async def rollout(shard: Shard, prompt: int) -> str:
        nonlocal started
        started += 1
        if started == 8:
            all_started.set()
        await gate.wait()
        return shard.name

    shards = [make_shard("big", weight=3), make_shard("small", weight=1)]
    async with Dispatcher(StaticShardSource(shards), FAST) as d:
        run = d.run(range(8), rollout)
        collector = asyncio.create_task(collect(run))
        await within(all_started.wait(), "all 8 attempts to start")
        peak = d.outstanding()
        gate.set()
        outcomes = await collector
    assert peak == {"big": 6, "small": 2}
    assert_accounted(run, outcomes, range(8))


async def test_a_shard_takes_at_most_its_turn_budget_of_new_attempts_per_loop_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pacing: attempts sent together come back together and least-outstanding replaces each on the shard it left, so
    a shard that has just begun answering 503 would get a whole wave before the loop reads its first answer. While
    another shard is pickable, a shard takes at most ``TURN_BUDGET`` new attempts per turn of the event loop (a turn
    ends where the rotation's ``new_turn`` runs); with one shard nothing waits."""
    turns = 0
    new_turn = Rotation.new_turn

    def counting_new_turn(self: Rotation) -> None:
        nonlocal turns
        turns += 1
        new_turn(self)

    monkeypatch.setattr(Rotation, "new_turn", counting_new_turn)
    gate = asyncio.Event()

    async def measure(names: tuple[str, ...]) -> Counter[tuple[str, int]]:
        started: Counter[tuple[str, int]] = Counter()
        all_started = asyncio.Event()

        async def rollout(shard: Shard, prompt: int) -> str:
            started[shard.name, turns] += 1
            if started.total() == 40:
                all_started.set()
            await gate.wait()
            return shard.name

        gate.clear()
        async with Dispatcher(StaticShardSource(make_shards(*names)), FAST) as d:
            run = d.run(range(40), rollout)
            collector = asyncio.create_task(collect(run))
            await within(all_started.wait(), "all 40 attempts to start")
            gate.set()
            outcomes = await collector
        assert_accounted(run, outcomes, range(40))
        return started

    paced = await measure(("a", "b"))
    assert max(paced.values()) == TURN_BUDGET, f"per shard and turn: {dict(paced)}"
    assert len({turn for _, turn in paced}) >= 40 // (2 * TURN_BUDGET), "the wave was not spread over turns"
    alone = await measure(("a",))
    assert len(alone) == 1, f"a single shard was paced: {dict(alone)}"


async def test_rollout_raising_a_run_terminal_error_ends_the_run_with_it() -> None:
    async def rollout(shard: Shard, prompt: int) -> int:
        raise RolloutStall("nested dispatcher stalled")

    async with Dispatcher(StaticShardSource(make_shards("a")), FAST) as d:
        run = d.run([0, 1], rollout)
        outcomes, error = await collect_until_error(run)
    assert isinstance(error, RolloutStall)
    assert_accounted(run, outcomes, [0, 1])


async def test_closing_a_run_early_aborts_the_rest_and_leaves_no_tasks() -> None:
    gate = asyncio.Event()

    async def rollout(shard: Shard, prompt: int) -> int:
        if prompt > 0:
            await gate.wait()
        return prompt

    before = asyncio.all_tasks()
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), FAST) as d:
        async with d.run(range(5), rollout) as run:
            async for outcome in run:
                assert outcome.prompt_id == 0
                break
        assert run.aborted_ids() == [1, 2, 3, 4]
        assert d.in_flight == 0
    assert asyncio.all_tasks() == before
    assert value(d, "rollout_in_flight") == 0


async def test_in_flight_is_one_count_that_the_runs_the_dispatcher_and_the_gauge_agree_on() -> None:
    """Each run's ``stats.in_flight`` is the count; the dispatcher's ``in_flight`` and rollout_in_flight sum it."""
    gate, all_started = asyncio.Event(), asyncio.Event()
    running: list[int] = []

    async def rollout(shard: Shard, prompt: int) -> int:
        running.append(prompt)
        if len(running) == 5:
            all_started.set()
        await gate.wait()
        return prompt

    async with Dispatcher(StaticShardSource(make_shards("a", "b")), FAST) as d:
        first, second = d.run(range(2), rollout), d.run(range(3), rollout)
        consumers = [asyncio.create_task(collect(first)), asyncio.create_task(collect(second))]
        await all_started.wait()
        assert (first.stats.in_flight, second.stats.in_flight) == (2, 3)
        assert d.in_flight == 5 == value(d, "rollout_in_flight")
        assert sum(d.outstanding().values()) == 5
        gate.set()
        await asyncio.gather(*consumers)
        assert d.in_flight == 0 == value(d, "rollout_in_flight")


async def test_leaving_the_dispatcher_stops_unconsumed_runs_and_closes_the_source() -> None:
    source = ControlledSource(make_shards("a"))

    all_started = asyncio.Event()
    started = 0

    async def rollout(shard: Shard, prompt: int) -> int:
        nonlocal started
        started += 1
        if started == 3:
            all_started.set()
        await asyncio.Event().wait()
        return prompt

    before = asyncio.all_tasks()
    async with Dispatcher(source, FAST) as d:
        run = d.run(range(3), rollout)
        consumer = asyncio.create_task(collect(run))  # a consumer still iterating
        await within(all_started.wait(), "all 3 attempts to start")
        assert d.in_flight == 3
    assert source.closed.is_set()
    with pytest.raises(RuntimeError, match="run closed with 3 unfinished prompt"):
        await consumer
    assert run.stats.aborted == 3
    assert asyncio.all_tasks() == before


async def test_a_source_that_ends_leaves_its_last_snapshot_in_force() -> None:
    source = ControlledSource(make_shards("a", "b"))
    source.end()
    async with Dispatcher(source, FAST) as d:
        await within(source.closed.wait(), "the dispatcher to consume the ended source")
        outcomes = await collect(d.run(range(4), echo_rollout()))
    assert {o.shard for o in outcomes if isinstance(o, Completed)} == {"a", "b"}


async def test_run_validates_prompt_ids() -> None:
    async with Dispatcher(StaticShardSource(make_shards("a")), FAST) as d:
        with pytest.raises(ValueError, match="unique"):
            d.run([1, 2], echo_rollout(), prompt_ids=["x", "x"])
        with pytest.raises(ValueError, match="2 prompt_ids for 3 prompts"):
            d.run([1, 2, 3], echo_rollout(), prompt_ids=["x", "y"])


def test_run_outside_the_context_manager_is_refused() -> None:
    d = Dispatcher(StaticShardSource(make_shards("a")))
    with pytest.raises(RuntimeError, match="async with Dispatcher"):
        d.run([1], echo_rollout())


async def test_observer_sees_every_attempt() -> None:
    events: list[Any] = []
    async with Dispatcher(StaticShardSource(make_shards("a")), FAST, observer=events.append) as d:
        await collect(d.run(range(3), echo_rollout()))
    ended = [e for e in events if isinstance(e, AttemptEnded)]
    assert sorted(e.prompt_id for e in ended) == [0, 1, 2]
    assert {e.outcome for e in ended} == {"success"}


async def test_ledger_lines_are_json_with_the_documented_fields(tmp_path: Path) -> None:
    async def rollout(shard: Shard, prompt: str) -> str:
        if prompt == "ok":
            return prompt
        raise RolloutTerminalDataFailure("bad")

    policy = REPORTING.model_copy(update={"failure_ledger_path": tmp_path / "f.jsonl"})
    async with Dispatcher(StaticShardSource(make_shards("a")), policy) as d:
        await collect(d.run(["x" * 1000, "ok"], rollout))
    line = (tmp_path / "f.jsonl").read_text().splitlines()[0]
    entry = json.loads(line)
    assert set(entry) == {
        "prompt_id",
        "result",
        "failure_class",
        "failure_type",
        "reason",
        "attempts",
        "shards",
        "time",
        "prompt_preview",
        "stale_by_version",
    }
    assert len(entry["prompt_preview"]) == 200
    assert entry["stale_by_version"] == {}


@pytest.mark.looptime
async def test_last_commit_time_starts_with_the_first_run_so_a_run_that_never_commits_is_a_stall() -> None:
    """The RolloutStall alert reads time() - rollout_last_commit_timestamp_seconds; it must not stay 0 forever."""
    source = ControlledSource([])
    async with Dispatcher(source, DispatchPolicy(healthy_wait_seconds=60)) as dispatcher:
        assert value(dispatcher, "rollout_last_commit_timestamp_seconds") == 0
        run = dispatcher.run(["p"], echo_rollout())
        consumer = asyncio.create_task(collect(run))
        await asyncio.sleep(0)  # one scheduling turn: the consumer's first __anext__ starts the run synchronously
        started = value(dispatcher, "rollout_last_commit_timestamp_seconds")
        assert started > 0
        source.publish(make_shards("late"))
        outcomes = await consumer
    assert len(outcomes) == 1
    assert value(dispatcher, "rollout_last_commit_timestamp_seconds") >= started


@pytest.mark.looptime
@pytest.mark.parametrize("seed", [1, 3, 8, 35, 36, 38, *range(60, 70)])
async def test_waiting_for_a_shard_never_spins_whatever_the_jitter(seed: int) -> None:
    """Regression: a deadline recomputed as "deadline - now" could leave a remainder below the clock's resolution
    that was due at once forever (these seeds hung: loop time never advanced)."""
    policy = DispatchPolicy(healthy_wait_seconds=5, max_infra_attempts=2, backoff_initial_seconds=1)
    async with Dispatcher(ControlledSource([]), policy, seed=seed) as dispatcher:
        outcomes, error = await collect_until_error(dispatcher.run(["p"], echo_rollout()), seconds=60)
    assert outcomes == []
    assert isinstance(error, RolloutRedispatchExhausted)


async def test_failures_inside_exception_groups_keep_their_meaning() -> None:
    """A TaskGroup's ExceptionGroup is walked like a cause chain: a terminal data failure in it stops retries at once,
    and an environment transport failure in it does not eject the generation shard."""
    calls: list[str] = []

    async def terminal(shard: Shard, prompt: int) -> None:
        if prompt == 1:
            return
        calls.append(shard.name)
        raise ExceptionGroup("episode", [RolloutTerminalDataFailure("no retries for this task")])

    async def environment_down(shard: Shard, prompt: int) -> str:
        calls.append(shard.name)
        if len(calls) == 1:
            raise ExceptionGroup("episode", [GymTransportError("environment server reset the connection")])
        return shard.name

    async with Dispatcher(StaticShardSource(make_shards("a", "b")), REPORTING) as d:
        [outcome] = by_kind(await collect(d.run([0, 1], terminal)))["data_failed"]
    assert isinstance(outcome, DataFailed)
    assert outcome.attempts == 1
    assert len(calls) == 1
    calls.clear()
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), FAST) as d:
        [outcome] = await collect(d.run([0], environment_down))
        assert d.ejected == frozenset()
    assert isinstance(outcome, Completed)


@pytest.mark.looptime
async def test_in_panic_mode_ejected_shards_are_on_trial_and_a_newer_success_brings_one_back() -> None:
    """Every healthy shard ejected (the only one left in rotation left the healthy set): the dispatcher routes to the
    ejected ones anyway, but each as on trial. A shard that answers 503 at once would otherwise have the fewest
    attempts in flight and draw the first attempt of nearly every prompt (least-outstanding's black hole); the shard
    whose attempt succeeds comes back, which ends panic mode."""
    attempts: Counter[str] = Counter()
    blipped = False

    async def rollout(shard: Shard, prompt: int) -> str:
        nonlocal blipped
        attempts[shard.name] += 1
        if shard.name == "sink" or (shard.name == "good" and not blipped):
            blipped = blipped or shard.name == "good"
            await asyncio.sleep(0.01)
            raise GenerationUnavailable("503 Service Unavailable")
        await asyncio.sleep(0.1)
        return shard.name

    events: list[DispatchEvent] = []
    panic = asyncio.Event()

    def observe(event: DispatchEvent) -> None:
        events.append(event)
        if isinstance(event, HealthyShardsChanged) and event.healthy == ("good", "sink") == event.routable:
            panic.set()

    policy = REPORTING.model_copy(
        update={"max_ejection_percent": 100.0, "ejection_base_seconds": 60.0, "max_concurrency": 8}
    )
    source = ControlledSource(make_shards("good", "sink", "spare"))
    async with Dispatcher(source, policy, observer=observe) as d:
        await within(d.wait_ready(3), "three shards routable")
        first = await collect(d.run(range(12), rollout))
        assert d.ejected == {"good", "sink"}, "both 503s ejected their shards"
        source.publish(make_shards("good", "sink"))  # the one shard in rotation leaves: panic mode
        await within(panic.wait(), "panic mode: both ejected shards routable")
        attempts.clear()
        outcomes = await collect(d.run(range(12, 52), rollout))
        assert d.ejected == {"sink"}
    assert [type(o) for o in [*first, *outcomes]] == [Completed] * 52
    assert {o.shard for o in outcomes if isinstance(o, Completed)} == {"good"}
    assert attempts["sink"] <= 12, f"the shard answering 503 at once drew {attempts['sink']} attempts of 40 prompts"
    assert [e.reason for e in events if isinstance(e, ShardRestored) and e.shard == "good"] == ["served"]


@pytest.mark.looptime
async def test_an_attempt_from_before_the_ejection_does_not_lift_the_restored_shards_trial() -> None:
    """A shard's trial counts the attempts started on trial only. One sent before its ejection (a long generation
    still running) says nothing about the shard now; counted, it dated the trial from before the ejection, so the
    trial's room had long grown and the restored shard took a burst at once."""
    loop = asyncio.get_running_loop()
    flaky_starts: list[float] = []
    trial_peaks: list[tuple[float, int]] = []
    failed_at: list[float] = []
    on_trial = 0

    async def rollout(shard: Shard, prompt: int) -> str:
        nonlocal on_trial
        if shard.name == "flaky":
            flaky_starts.append(loop.time())
            if len(flaky_starts) == 1:
                await asyncio.sleep(10)  # sent before the ejection: in flight through it and after it
                return shard.name
            if len(flaky_starts) == 2:
                await asyncio.sleep(0.01)
                failed_at.append(loop.time())
                raise GenerationUnavailable("503 Service Unavailable")
            if not failed_at:  # sent in the same turns as the failing one, before it came back
                await asyncio.sleep(0.1)
                return shard.name
            on_trial += 1
            trial_peaks.append((loop.time(), on_trial))
            try:
                await asyncio.sleep(1.0)
            finally:
                on_trial -= 1
            return shard.name
        await asyncio.sleep(0.1)
        return shard.name

    policy = REPORTING.model_copy(
        update={"max_ejection_percent": 100.0, "ejection_base_seconds": 1.0, "max_concurrency": 16}
    )
    async with Dispatcher(StaticShardSource(make_shards("flaky", "steady")), policy) as d:
        outcomes = await collect(d.run(range(240), rollout))
    assert [type(o) for o in outcomes] == [Completed] * 240
    assert value(d, "rollout_ejections_total", shard="flaky") == 1
    first = trial_peaks[0][0]
    assert failed_at[0] + 1.0 <= first < flaky_starts[0] + 10, "no trial between the restoration and the old end"
    # The room doubles each 4 x 0.01 s (the failure that ejected it) from the first trial attempt, so at most 4 in
    # its first 0.12 s; dated from before the ejection, it had already grown past any limit.
    early = [n for t, n in trial_peaks if t - first < 0.12]
    assert early[0] == 1
    assert max(early) <= 4, f"the restored shard took a burst: {trial_peaks[:8]}"
