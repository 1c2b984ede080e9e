"""settle(): one failed attempt's evidence and budgets in, one action out; the prompt's budget is never mutated."""

from __future__ import annotations

from rollout_runtime.dispatch import DispatchPolicy, PromptBudget
from rollout_runtime.dispatch.blame import Blame, Signature, Verdict
from rollout_runtime.dispatch.settle import (
    Busy,
    Charge,
    EndRun,
    Evidence,
    GiveUpData,
    GiveUpExhausted,
    Retry,
    Settlement,
    settle,
)
from rollout_runtime.failures import Diagnosis, FailureClass

POLICY = DispatchPolicy(
    max_infra_attempts=3, max_data_attempts=2, backoff_initial_seconds=1, backoff_multiplier=2, backoff_jitter=0
)
FIRST = Evidence(Verdict(Blame.FIRST_VERDICT))


def infra(status: int | None = None, *, retry_after: float | None = None, blames_shard: bool = True) -> Diagnosis:
    return Diagnosis(FailureClass.INFRA, "GenerationUnavailable", blames_shard, False, "down", status, retry_after)


def data(status: int | None = 400, *, terminal: bool = False) -> Diagnosis:
    return Diagnosis(FailureClass.DATA, "RolloutDataFailure", False, terminal, "too long", status)


def sig_of(diagnosis: Diagnosis) -> Signature | None:
    status = diagnosis.status
    return None if status is None else (diagnosis.failure_type, status, diagnosis.reason)


def run_settle(
    diagnosis: Diagnosis,
    evidence: Evidence = FIRST,
    budget: PromptBudget | None = None,
    charges: tuple[Charge, ...] = (),
    *,
    immediate: bool = False,
) -> Settlement:
    return settle(
        POLICY,
        diagnosis,
        sig_of(diagnosis),
        evidence,
        budget if budget is not None else PromptBudget(),
        charges,
        shard="a",
        tried=["a"],
        immediate=immediate,
        draw=lambda: 0.0,
    )


def test_the_prompts_budget_is_never_mutated_the_settlement_carries_the_new_one() -> None:
    budget = PromptBudget()
    settled = run_settle(infra(), budget=budget)
    assert budget == PromptBudget()
    assert settled.budget == PromptBudget(infra_failures=1)


def test_a_transport_failure_ejects_its_shard_and_retries_at_once_only_if_another_shard_can_take_it() -> None:
    settled = run_settle(infra())
    assert settled.outcome == "infra_failure"
    assert settled.eject
    assert settled.action == Retry(1.0, at_once_elsewhere=True)


def test_a_failure_that_is_not_the_shards_backs_off_and_ejects_nothing() -> None:
    settled = run_settle(infra(blames_shard=False))
    assert not settled.eject
    assert settled.action == Retry(1.0)


def test_the_progress_watchdog_already_waited_so_its_retry_needs_no_backoff() -> None:
    assert run_settle(infra(), immediate=True).action == Retry(0.0, at_once_elsewhere=True)


def test_a_busy_shard_is_charged_to_neither_budget_and_never_ejected() -> None:
    settled = run_settle(infra(429), Evidence(Verdict(Blame.BACKPRESSURE)))
    assert settled.action == Busy()
    assert settled.budget == PromptBudget(evictions=1)
    assert not settled.eject


def test_an_infra_budget_used_up_gives_the_prompt_up_as_exhausted() -> None:
    settled = run_settle(infra(), budget=PromptBudget(infra_failures=2))
    assert settled.action == GiveUpExhausted()


def test_one_non_transient_answer_from_every_shard_tried_is_a_poison_prompt_by_elimination() -> None:
    settled = run_settle(infra(500), Evidence(Verdict(Blame.FIRST_VERDICT), followed=True), PromptBudget(2))
    assert settled.action == GiveUpData("poison prompt: the same answer on shards a; down")


def test_a_confirmed_data_answer_retries_at_once_then_data_fails_the_prompt() -> None:
    first = run_settle(data())
    assert first.outcome == "data_failure"
    assert first.action == Retry(0.0)
    assert first.data_charges == (("a", sig_of(data())),)
    second = run_settle(data(), budget=first.budget, charges=first.data_charges)
    assert second.action == GiveUpData()


def test_an_unconfirmed_data_answer_is_charged_as_infra_instead() -> None:
    unconfirmed = Evidence(Verdict(Blame.FIRST_VERDICT), confirmed=False)
    settled = run_settle(data(), unconfirmed, PromptBudget(data_failures=1))
    assert settled.budget == PromptBudget(infra_failures=1, data_failures=1)
    assert isinstance(settled.action, Retry)


def test_a_data_charge_from_a_shard_since_judged_sick_is_refunded_to_the_infra_budget() -> None:
    sick_charge: Charge = ("b", ("RolloutDataFailure", 400, "too long"))
    evidence = Evidence(Verdict(Blame.FIRST_VERDICT), sick=[sick_charge])
    settled = run_settle(data(), evidence, PromptBudget(data_failures=1), (sick_charge,))
    assert sick_charge not in settled.data_charges
    assert settled.budget == PromptBudget(infra_failures=1, data_failures=1)
    assert isinstance(settled.action, Retry)


def test_a_terminal_data_failure_is_given_up_on_at_once() -> None:
    assert run_settle(data(terminal=True)).action == GiveUpData()


def test_a_misconfigured_fleet_ends_the_run_with_the_evidence() -> None:
    settled = run_settle(infra(401), Evidence(Verdict(Blame.MISCONFIGURED, "every shard answers 401")))
    assert settled.action == EndRun("every shard answers 401")
    assert not settled.eject


def test_a_poison_verdict_data_fails_the_prompt_without_ejecting_the_shard() -> None:
    settled = run_settle(infra(500), Evidence(Verdict(Blame.POISON, "poison prompt: on 2 shards")))
    assert settled.outcome == "data_failure"
    assert settled.action == GiveUpData("poison prompt: on 2 shards; down")
    assert not settled.eject


def test_a_sick_shard_verdict_ejects_it_and_charges_infra() -> None:
    settled = run_settle(data(), Evidence(Verdict(Blame.SICK_SHARD, "shard a failed 2 prompts")))
    assert settled.outcome == "infra_failure"
    assert settled.eject
    assert settled.data_charges == ()
