"""NeMo-RL's drop semantics: the pure rules (dispatch/drops.py), the policy that carries them, and the engine acting
on them (max_skipped_prompts, max_consecutive_dropped_prompts, min_step_batch_fraction, on_dropped_prompt)."""

from __future__ import annotations

from typing import Any

import looptime
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rollout_runtime.dispatch import Completed, DataFailed, Dispatcher, DispatchPolicy, Skipped
from rollout_runtime.dispatch.drops import (
    DropCounts,
    FailRun,
    ReplaceDecision,
    ShrinkDecision,
    batch_floor,
    decide_drop,
)
from rollout_runtime.failures import (
    GenerationUnavailable,
    RolloutBatchTooSmall,
    RolloutDataFailure,
    RolloutRedispatchExhausted,
)
from rollout_runtime.shards import Shard, StaticShardSource
from support.dispatch import assert_accounted, by_kind, collect, collect_until_error, make_shards

FAST: dict[str, Any] = {"backoff_initial_seconds": 0, "backoff_max_seconds": 0, "healthy_wait_seconds": 5}


def policy(**fields: Any) -> DispatchPolicy:
    return DispatchPolicy(**{**FAST, **fields})


# -- the policy ----------------------------------------------------------------------------------------------------


def test_defaults_are_nemo_rls() -> None:
    p = DispatchPolicy()
    assert (p.max_skipped_prompts, p.max_consecutive_dropped_prompts, p.min_step_batch_fraction) == (0, 0, 0.9)
    assert (p.on_dropped_prompt, p.max_replacement_attempts, p.replacement_reserve_prompts) == ("shrink", 1, 1)


@pytest.mark.parametrize("field", ["max_replacement_attempts", "replacement_reserve_prompts"])
def test_replace_requires_at_least_one_replacement_and_one_reserve_prompt(field: str) -> None:
    with pytest.raises(ValidationError, match=f"on_dropped_prompt='replace' requires {field} \\(0\\) >= 1"):
        DispatchPolicy(on_dropped_prompt="replace", **{field: 0})
    DispatchPolicy(on_dropped_prompt="shrink", **{field: 0})  # read only with replace


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01, float("nan")])
def test_min_step_batch_fraction_is_within_0_exclusive_and_1(fraction: float) -> None:
    with pytest.raises(ValidationError, match="min_step_batch_fraction"):
        DispatchPolicy(min_step_batch_fraction=fraction)


def test_a_rolloutfleet_policy_carries_the_drop_fields_in_camel_case() -> None:
    p = DispatchPolicy.from_fleet(
        {
            "maxSkippedPrompts": 3,
            "maxConsecutiveDroppedPrompts": 2,
            "minStepBatchFraction": 0.75,
            "onDroppedPrompt": "replace",
            "maxReplacementAttempts": 2,
            "replacementReservePrompts": 8,
        }
    )
    assert (p.max_skipped_prompts, p.max_consecutive_dropped_prompts, p.min_step_batch_fraction) == (3, 2, 0.75)
    assert (p.on_dropped_prompt, p.max_replacement_attempts, p.replacement_reserve_prompts) == ("replace", 2, 8)


# -- the pure rules ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fraction", "size", "floor"),
    [(0.9, 8, 8), (0.9, 10, 9), (0.9, 100, 90), (0.7, 10, 7), (0.5, 3, 2), (1.0, 4, 4), (0.01, 1, 1), (0.9, 0, 0)],
)
def test_batch_floor_is_the_ceiling_of_fraction_times_size_without_float_noise(
    fraction: float, size: int, floor: int
) -> None:
    assert batch_floor(policy(min_step_batch_fraction=fraction), size) == floor


def test_the_first_data_exhausted_prompt_fails_the_run_by_default() -> None:
    decision = decide_drop(DispatchPolicy(), DropCounts(), "data", size=100, lost=0, replaced=0, reserve_left=0)
    assert isinstance(decision, FailRun)
    assert decision.rule == "max_skipped_prompts"
    assert "max_skipped_prompts=0" in decision.message


def test_max_skipped_prompts_counts_data_exhausted_prompts_for_the_lifetime_and_ignores_commits() -> None:
    p = policy(max_skipped_prompts=2, min_step_batch_fraction=0.01)
    counts = DropCounts(skipped_prompts=1)
    counts.committed()  # a commit does not make a dataset better
    assert isinstance(decide_drop(p, counts, "data", size=10, lost=1, replaced=0, reserve_left=0), ShrinkDecision)
    counts.skipped_prompts = 2
    decision = decide_drop(p, counts, "data", size=10, lost=2, replaced=0, reserve_left=0)
    assert isinstance(decision, FailRun)
    assert decision.rule == "max_skipped_prompts"


def test_max_consecutive_dropped_prompts_counts_infra_drops_and_a_commit_resets_it() -> None:
    p = policy(max_consecutive_dropped_prompts=1, min_step_batch_fraction=0.01)
    counts = DropCounts(consecutive_dropped_prompts=1)
    decision = decide_drop(p, counts, "infra", size=10, lost=1, replaced=0, reserve_left=0)
    assert isinstance(decision, FailRun)
    assert decision.rule == "max_consecutive_dropped_prompts"
    counts.committed()
    assert isinstance(decide_drop(p, counts, "infra", size=10, lost=1, replaced=0, reserve_left=0), ShrinkDecision)


def test_the_two_budgets_are_independent() -> None:
    """A bad dataset must not spend the allowance that rides out an outage, nor the other way round."""
    p = policy(max_skipped_prompts=1, max_consecutive_dropped_prompts=1, min_step_batch_fraction=0.01)
    full_data = DropCounts(skipped_prompts=1)
    assert isinstance(decide_drop(p, full_data, "infra", size=9, lost=1, replaced=0, reserve_left=0), ShrinkDecision)
    full_infra = DropCounts(consecutive_dropped_prompts=1)
    assert isinstance(decide_drop(p, full_infra, "data", size=9, lost=1, replaced=0, reserve_left=0), ShrinkDecision)


def test_shrinking_below_the_batch_floor_fails_the_run() -> None:
    p = policy(max_skipped_prompts=100, min_step_batch_fraction=0.9)
    assert isinstance(decide_drop(p, DropCounts(), "data", size=10, lost=0, replaced=0, reserve_left=0), ShrinkDecision)
    decision = decide_drop(p, DropCounts(), "data", size=10, lost=1, replaced=0, reserve_left=0)
    assert isinstance(decision, FailRun)
    assert decision.rule == "min_step_batch_fraction"
    assert "lost 2 of 10" in decision.message
    small = decide_drop(p, DropCounts(), "data", size=8, lost=0, replaced=0, reserve_left=0)
    assert isinstance(small, FailRun), "at 0.9 a batch of 8 or fewer tolerates no drop"


def test_an_open_ended_session_has_no_batch_floor_only_the_allowances() -> None:
    """A session (size 0) is not a step: losing prompts never trips min_step_batch_fraction; the budgets still do."""
    p = policy(max_skipped_prompts=2, min_step_batch_fraction=1.0)
    counts = DropCounts(skipped_prompts=1)
    assert isinstance(decide_drop(p, counts, "data", size=0, lost=5, replaced=0, reserve_left=0), ShrinkDecision)
    spent = decide_drop(p, DropCounts(skipped_prompts=2), "data", size=0, lost=5, replaced=0, reserve_left=0)
    assert isinstance(spent, FailRun)
    assert spent.rule == "max_skipped_prompts"


def test_replace_refills_a_position_up_to_max_replacement_attempts_then_shrinks() -> None:
    p = policy(
        max_skipped_prompts=100,
        on_dropped_prompt="replace",
        max_replacement_attempts=2,
        min_step_batch_fraction=0.5,
    )
    counts = DropCounts()
    for replaced in (0, 1):
        decision = decide_drop(p, counts, "data", size=4, lost=0, replaced=replaced, reserve_left=5)
        assert isinstance(decision, ReplaceDecision)
    assert isinstance(decide_drop(p, counts, "data", size=4, lost=0, replaced=2, reserve_left=5), ShrinkDecision)


def test_replace_with_an_empty_reserve_falls_back_to_shrink_and_the_floor() -> None:
    p = policy(max_skipped_prompts=100, on_dropped_prompt="replace", min_step_batch_fraction=1.0)
    decision = decide_drop(p, DropCounts(), "data", size=4, lost=0, replaced=0, reserve_left=0)
    assert isinstance(decision, FailRun)
    assert decision.rule == "min_step_batch_fraction"


def test_a_replaced_prompt_still_counts_against_its_budget() -> None:
    p = policy(on_dropped_prompt="replace")  # max_skipped_prompts=0
    decision = decide_drop(p, DropCounts(), "data", size=4, lost=0, replaced=0, reserve_left=3)
    assert isinstance(decision, FailRun)
    assert decision.rule == "max_skipped_prompts"


# -- the engine acting on them (in-process fakes; the sim-fleet integration test runs real shard processes) --------


def _failing(bad: set[int], error: type[Exception] = RolloutDataFailure) -> Any:
    async def rollout(shard: Shard, prompt: int) -> int:
        if prompt in bad:
            raise error(f"prompt {prompt} is bad")
        return prompt

    return rollout


async def test_a_data_failed_prompt_ends_the_run_with_rollout_data_failure_by_default() -> None:
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), policy(max_concurrency=1)) as dispatcher:
        run = dispatcher.run(range(20), _failing({3}))
        outcomes, error = await collect_until_error(run)
    assert isinstance(error, RolloutDataFailure)
    assert "prompt 3" in str(error)
    assert "max_skipped_prompts=0" in str(error)
    assert isinstance(error.__cause__, RolloutDataFailure), "the original failure is the cause"
    assert 3 in run.aborted_ids()
    assert_accounted(run, outcomes, range(20))


async def test_independent_requests_are_only_reported_and_never_count_against_the_drop_rules() -> None:
    """drop_rules=False (the router's requests, an environment pool's episodes): a one-prompt run that data-fails or
    exhausts its infra budget is that request's answer, not the end of a training step or of the dispatcher."""
    p = policy(max_infra_attempts=1)
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), p) as dispatcher:
        for bad, error in ((0, RolloutDataFailure), (0, GenerationUnavailable), (1, RolloutDataFailure)):
            run = dispatcher.run(
                [bad], _failing({bad}, error), prompt_ids=[f"{bad}-{error.__name__}"], drop_rules=False
            )
            (outcome,) = await collect(run)
            assert isinstance(outcome, DataFailed if error is RolloutDataFailure else Skipped), outcome
        (ok,) = await collect(dispatcher.run([2], _failing(set()), drop_rules=False))
    assert isinstance(ok, Completed)
    assert (dispatcher.drops.skipped_prompts, dispatcher.drops.consecutive_dropped_prompts) == (0, 0)


async def test_max_skipped_prompts_spans_the_dispatchers_runs() -> None:
    """NeMo-RL counts skipped prompts for the training run: one Dispatcher, many runs (steps)."""
    p = policy(max_skipped_prompts=1, min_step_batch_fraction=0.5)
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), p) as dispatcher:
        first = dispatcher.run(range(4), _failing({0}))
        assert len(by_kind(await collect(first))["data_failed"]) == 1
        second = dispatcher.run(range(4), _failing({0}))
        outcomes, error = await collect_until_error(second)
    assert dispatcher.drops.skipped_prompts == 1
    assert isinstance(error, RolloutDataFailure)
    assert "2 prompt(s) exhausted their data budget" in str(error)
    assert_accounted(second, outcomes, range(4))


async def test_consecutive_infra_drops_end_the_run_and_a_commit_in_between_resets_the_count() -> None:
    p = policy(max_infra_attempts=1, max_consecutive_dropped_prompts=1, max_concurrency=1, min_step_batch_fraction=0.1)
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), p) as dispatcher:
        apart = dispatcher.run(range(6), _failing({1, 3, 5}, GenerationUnavailable))
        outcomes = await collect(apart)
        assert [o.prompt_id for o in by_kind(outcomes)["skipped"]] == [1, 3, 5], "a commit between each resets it"
        together = dispatcher.run(range(6), _failing({2, 3}, GenerationUnavailable))
        outcomes, error = await collect_until_error(together)
    assert isinstance(error, RolloutRedispatchExhausted)
    assert "prompt 3" in str(error)
    assert "max_consecutive_dropped_prompts=1" in str(error)
    assert_accounted(together, outcomes, range(6))


async def test_shrink_below_the_floor_ends_the_run_with_rollout_batch_too_small() -> None:
    p = policy(max_skipped_prompts=100, max_concurrency=1)  # floor: ceil(0.9 * 10) = 9
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), p) as dispatcher:
        run = dispatcher.run(range(10), _failing({2, 6}))
        outcomes, error = await collect_until_error(run)
    assert isinstance(error, RolloutBatchTooSmall)
    assert "lost 2 of 10" in str(error)
    assert "min_step_batch_fraction=0.9" in str(error)
    assert [o.prompt_id for o in by_kind(outcomes)["data_failed"]] == [2]
    assert 6 in run.aborted_ids()
    assert_accounted(run, outcomes, range(10))


async def test_replace_refills_dropped_positions_from_the_reserve_so_the_batch_keeps_its_size() -> None:
    p = policy(
        max_skipped_prompts=10,
        max_infra_attempts=1,
        max_consecutive_dropped_prompts=10,
        on_dropped_prompt="replace",
        max_replacement_attempts=2,
        replacement_reserve_prompts=2,
        min_step_batch_fraction=1.0,
    )
    # 1 data-fails; its first replacement (100) infra-drops, its second (101) completes; 102 is never drawn.
    rollout = _failing({1}, RolloutDataFailure)
    bad_infra = _failing({100}, GenerationUnavailable)

    async def both(shard: Shard, prompt: int) -> int:
        return await (bad_infra if prompt == 100 else rollout)(shard, prompt)

    async with Dispatcher(StaticShardSource(make_shards("a", "b")), p) as dispatcher:
        run = dispatcher.run([0, 1, 2], both, reserve=[100, 101, 102])
        outcomes = await collect(run)
    kinds = by_kind(outcomes)
    assert sorted(o.result for o in kinds["completed"]) == [0, 2, 101], "the batch of 3 still has 3 results"
    assert [o.prompt_id for o in kinds["data_failed"]] == [1]
    assert [o.prompt_id for o in kinds["skipped"]] == [3], "reserve ids continue the positions: 100 is id 3"
    assert run.stats.submitted == 5, "only reserve prompts drawn are submitted"
    assert_accounted(run, outcomes, [0, 1, 2, 3, 4])


async def test_replace_gives_up_after_max_replacement_attempts_and_shrinks() -> None:
    p = policy(
        max_skipped_prompts=10,
        on_dropped_prompt="replace",
        max_replacement_attempts=1,
        min_step_batch_fraction=0.5,
    )
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), p) as dispatcher:
        run = dispatcher.run([0, 1], _failing({1, 100}), reserve=[100, 101])
        outcomes = await collect(run)
    kinds = by_kind(outcomes)
    assert [o.result for o in kinds["completed"]] == [0]
    assert sorted(o.prompt_id for o in kinds["data_failed"]) == [1, 2]
    assert run.stats.submitted == 3
    assert_accounted(run, outcomes, [0, 1, 2])


async def test_run_checks_the_reserve_against_the_policy() -> None:
    replace = policy(on_dropped_prompt="replace", replacement_reserve_prompts=2)
    async with Dispatcher(StaticShardSource(make_shards("a")), replace) as dispatcher:
        with pytest.raises(ValueError, match="needs a reserve of at least replacement_reserve_prompts=2"):
            dispatcher.run([1], _failing(set()), reserve=[2])
        with pytest.raises(ValueError, match="also pass reserve_ids"):
            dispatcher.run([1], _failing(set()), prompt_ids=["a"], reserve=[2, 3])
        with pytest.raises(ValueError, match="must be unique"):
            dispatcher.run([1], _failing(set()), prompt_ids=["a"], reserve=[2, 3], reserve_ids=["a", "b"])
    async with Dispatcher(StaticShardSource(make_shards("a")), policy()) as dispatcher:
        with pytest.raises(ValueError, match="only with on_dropped_prompt='replace'"):
            dispatcher.run([1], _failing(set()), reserve=[2])


# -- the invariant, with drops and replacements ---------------------------------------------------------------------

Fate = str
FATES: tuple[Fate, ...] = ("ok", "data", "infra")


async def _run_fates(fates: list[Fate], reserve: list[Fate], p: DispatchPolicy) -> tuple[Any, list[Any], Any]:
    def fate_of(prompt: tuple[str, Fate]) -> Fate:
        return prompt[1]

    async def rollout(shard: Shard, prompt: tuple[str, Fate]) -> str:
        fate = fate_of(prompt)
        if fate == "data":
            raise RolloutDataFailure(f"{prompt[0]} is bad")
        if fate == "infra":
            raise GenerationUnavailable(f"{prompt[0]} hit a sick fleet")
        return prompt[0]

    prompts = [(f"p{i}", fate) for i, fate in enumerate(fates)]
    spares = [(f"r{i}", fate) for i, fate in enumerate(reserve)]
    async with Dispatcher(StaticShardSource(make_shards("a", "b")), p, seed=0) as dispatcher:
        kwargs: dict[str, Any] = {"reserve": spares} if p.on_dropped_prompt == "replace" else {}
        run = dispatcher.run(prompts, rollout, **kwargs)
        outcomes, error = await collect_until_error(run, seconds=60)
    return run, outcomes, error


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fates=st.lists(st.sampled_from(FATES), min_size=1, max_size=10),
    reserve=st.lists(st.sampled_from(FATES), min_size=1, max_size=6),
    mode=st.sampled_from(["shrink", "replace"]),
    replacements=st.integers(1, 3),
    skipped=st.integers(0, 6),
    consecutive=st.integers(0, 6),
    fraction=st.sampled_from([0.01, 0.5, 0.9, 1.0]),
    concurrency=st.none() | st.integers(1, 3),
)
def test_every_submitted_prompt_is_accounted_for_exactly_once_with_drops_and_replacements(
    fates: list[Fate],
    reserve: list[Fate],
    mode: str,
    replacements: int,
    skipped: int,
    consecutive: int,
    fraction: float,
    concurrency: int | None,
) -> None:
    """Whatever prompts fail, however the drop rules decide and whichever reserve prompts are drawn:
    submitted == completed + data_failed + skipped + aborted, every submitted prompt (originals and drawn reserve
    prompts, never an undrawn one) is delivered or aborted exactly once, a run that ends normally has at least the
    batch floor of completions and never more than its batch size, and each position draws at most
    max_replacement_attempts replacements."""
    p = policy(
        max_infra_attempts=1,
        max_data_attempts=1,
        max_skipped_prompts=skipped,
        max_consecutive_dropped_prompts=consecutive,
        min_step_batch_fraction=fraction,
        on_dropped_prompt=mode,
        max_replacement_attempts=replacements,
        max_concurrency=concurrency,
    )
    loop = looptime.new_event_loop()
    try:
        run, outcomes, error = loop.run_until_complete(_run_fates(fates, reserve, p))
    finally:
        loop.close()
    submitted = [state.prompt_id for state in run.states]
    assert len(submitted) == run.stats.submitted <= len(fates) + (len(reserve) if mode == "replace" else 0)
    assert submitted[: len(fates)] == list(range(len(fates)))
    assert_accounted(run, outcomes, submitted)
    assert max(run.replaced.values(), default=0) <= replacements
    completed = [o for o in outcomes if isinstance(o, Completed)]
    if error is None:
        assert batch_floor(p, len(fates)) <= len(completed) <= len(fates)
        assert all(isinstance(o, Completed | DataFailed | Skipped) for o in outcomes)
    else:
        assert isinstance(error, RolloutDataFailure | RolloutRedispatchExhausted | RolloutBatchTooSmall)
