"""Accounting under random failure schedules: every prompt ends exactly once, as its budgets dictate."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Literal

import looptime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_runtime.dispatch import Completed, DataFailed, Dispatcher, DispatchPolicy, Skipped
from rollout_runtime.dispatch.drops import batch_floor
from rollout_runtime.failures import (
    GenerationUnavailable,
    RolloutBatchTooSmall,
    RolloutDataFailure,
    RolloutRedispatchExhausted,
    RolloutTerminalDataFailure,
)
from rollout_runtime.shards import Shard
from support.dispatch import ControlledSource, assert_accounted, collect_until_error, make_shards

Action = Literal["ok", "infra", "data", "terminal", "evict"]
ACTIONS: tuple[Action, ...] = ("ok", "infra", "data", "terminal", "evict")


def expected_fate(actions: list[Action], policy: DispatchPolicy) -> tuple[str, int]:
    """What the budgets say happens to a prompt whose attempts do ``actions`` (then succeed): (result, attempts)."""
    infra = data = 0
    for used, action in enumerate([*actions, "ok"], start=1):
        if action == "ok":
            return "completed", used
        if action == "terminal":
            return "data_failed", used
        if action == "data":
            data += 1
            if data >= policy.max_data_attempts:
                return "data_failed", used
        if action == "infra":
            infra += 1
            if infra >= policy.max_infra_attempts:
                return "exhausted", used
    raise AssertionError("unreachable")


async def run_schedule(
    schedule: list[list[Action]], shard_count: int, policy: DispatchPolicy
) -> tuple[list[Any], BaseException | None, Any, Dispatcher, Counter[str], Counter[int]]:
    shards = make_shards(*(f"s{i}" for i in range(shard_count)))
    source = ControlledSource(shards)
    attempts: Counter[int] = Counter()
    seen: Counter[str] = Counter()
    interrupted: Counter[int] = Counter()

    async def rollout(shard: Shard, prompt: int) -> tuple[int, str]:
        try:
            await asyncio.sleep(0)  # let other attempts interleave
        except asyncio.CancelledError:
            # Evicted by another prompt's eviction of this shard before doing anything: no action consumed.
            interrupted[prompt] += 1
            raise
        index = attempts[prompt]
        attempts[prompt] += 1
        actions = schedule[prompt]
        action = actions[index] if index < len(actions) else "ok"
        seen[action] += 1
        if action == "infra":
            raise GenerationUnavailable(f"{shard.name} refused")
        if action == "data":
            raise RolloutDataFailure(f"prompt {prompt} is too long")
        if action == "terminal":
            raise RolloutTerminalDataFailure(f"prompt {prompt} rejected")
        if action == "evict":
            # The probes drop this shard (and bring it back): the attempt hangs until the dispatcher evicts it.
            source.publish([s for s in shards if s.name != shard.name])
            source.publish(shards)
            await asyncio.Event().wait()
        return prompt, shard.name

    async with Dispatcher(source, policy, seed=0) as dispatcher:
        run = dispatcher.run(range(len(schedule)), rollout)
        outcomes, error = await collect_until_error(run, seconds=60)  # loop time: no schedule needs a second
    return outcomes, error, run, dispatcher, seen, interrupted


schedules = st.lists(st.lists(st.sampled_from(ACTIONS), max_size=6), min_size=1, max_size=10)
policies = st.builds(
    DispatchPolicy,
    max_infra_attempts=st.integers(1, 4),
    max_data_attempts=st.integers(1, 3),
    max_skipped_prompts=st.integers(0, 3),
    max_consecutive_dropped_prompts=st.integers(0, 3),
    min_step_batch_fraction=st.sampled_from([0.01, 0.5, 0.9, 1.0]),
    max_concurrency=st.none() | st.integers(1, 4),
    backoff_initial_seconds=st.just(0.0),
    backoff_max_seconds=st.just(0.0),
    healthy_wait_seconds=st.just(1.0),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=schedules, shard_count=st.integers(1, 4), policy=policies)
def test_every_prompt_ends_exactly_once_as_its_budgets_dictate(
    schedule: list[list[Action]], shard_count: int, policy: DispatchPolicy
) -> None:
    """Invariants, for any schedule of per-attempt failures (infra, data, terminal data, eviction):
    - each prompt is delivered at most once, and delivered + aborted = all prompts (nothing lost or duplicated);
    - a delivered prompt's outcome and attempt count are exactly what its budgets dictate (attempts evicted
      before doing anything are extra attempts and charge nothing);
    - the drop rules (NeMo-RL's): more data-failed prompts than max_skipped_prompts, or more given up on than the
      batch floor leaves, always end the run; within every allowance the run ends normally with every prompt
      delivered; the error names the rule that ended it;
    - data failures carry a reason; evictions are charged to no budget;
    - the metrics agree with the run's counters."""
    # A private loop, never installed as the current one: asyncio.run() would unset the loop pytest's plugins
    # created for this sync test and leak it. Its clock is looptime's: a hung example fails its run's deadline at
    # once instead of every example and every shrink waiting the deadline out in real time.
    loop = looptime.new_event_loop()
    try:
        ran = loop.run_until_complete(run_schedule(schedule, shard_count, policy))
    finally:
        loop.close()
    outcomes, error, run, dispatcher, seen, interrupted = ran
    assert_accounted(run, outcomes, range(len(schedule)))
    fates = {prompt: expected_fate(actions, policy) for prompt, actions in enumerate(schedule)}
    exhausted = sum(1 for result, _ in fates.values() if result == "exhausted")
    data_failed = sum(1 for result, _ in fates.values() if result == "data_failed")
    spare = len(schedule) - batch_floor(policy, len(schedule))
    for outcome in outcomes:
        result, attempts = fates[outcome.prompt_id]
        if isinstance(outcome, Completed):
            assert result == "completed"
            assert outcome.result[0] == outcome.prompt_id
        elif isinstance(outcome, DataFailed):
            assert result == "data_failed"
            assert f"prompt {outcome.prompt_id}" in outcome.reason
        else:
            assert isinstance(outcome, Skipped)
            assert result == "exhausted"
        assert outcome.attempts == attempts + interrupted[outcome.prompt_id]
    within = data_failed <= policy.max_skipped_prompts and data_failed + exhausted <= spare
    if not within:
        assert error is not None
    if within and exhausted <= policy.max_consecutive_dropped_prompts:
        assert error is None
    if isinstance(error, RolloutDataFailure):
        assert "max_skipped_prompts" in str(error)
        assert run.stats.data_failed == policy.max_skipped_prompts < data_failed
    elif isinstance(error, RolloutRedispatchExhausted):
        assert "max_consecutive_dropped_prompts" in str(error)
        assert policy.max_consecutive_dropped_prompts < exhausted
    elif isinstance(error, RolloutBatchTooSmall):
        assert "min_step_batch_fraction" in str(error)
        assert run.stats.data_failed + run.stats.skipped == spare < data_failed + exhausted
    else:
        assert error is None
        assert len(outcomes) == len(schedule)
        assert sum(isinstance(o, Skipped) for o in outcomes) == exhausted
        assert run.stats.redispatches == run.stats.attempts - len(schedule)
    stats = run.stats
    assert stats.successes == seen["ok"]
    assert stats.infra_failures == seen["infra"]
    assert stats.data_failures == seen["data"] + seen["terminal"]
    if error is None:
        assert stats.cancelled == seen["evict"] + sum(interrupted.values())
    value = dispatcher.metrics.value
    for outcome_label, count in (
        ("success", stats.successes),
        ("infra_failure", stats.infra_failures),
        ("data_failure", stats.data_failures),
        ("cancelled", stats.cancelled),
    ):
        assert value("rollout_attempts_total", {"outcome": outcome_label}) == count
    assert value("rollout_prompts_total", {"result": "completed"}) == stats.completed
    assert value("rollout_prompts_total", {"result": "data_failed"}) == stats.data_failed
    assert value("rollout_prompts_total", {"result": "skipped"}) == stats.skipped
    assert value("rollout_redispatches_total") == stats.redispatches
    assert value("rollout_redispatch_exhausted_total") == stats.exhausted
    assert value("rollout_in_flight") == 0
