"""Settling a failed attempt: the evidence's verdict and the prompt's budgets in, one action out, nothing mutated.

The dispatcher reads the failure once (:func:`~rollout_runtime.failures.diagnose`), records it as evidence
(:func:`~rollout_runtime.dispatch.blame.judge`, which returns the verdict) and asks :func:`settle` what follows. The
answer is a :class:`Settlement`: how the attempt is counted, the prompt's budget and data charges after it, whether
its shard is ejected, and one action:

- :class:`EndRun`: every shard gives the same answer and nothing succeeds: the fleet is misconfigured;
- :class:`Busy`: the shard is busy (429, or 503 with Retry-After): charged to neither budget, the shard's share
  shrinks, the prompt goes back at once and waits for room on the shard it is sent to (``gate``);
- :class:`Retry`: another attempt, after the backoff, or at once;
- :class:`GiveUpData`: the prompt is data-failed (its data budget is spent, the failure forbade retries, or the
  evidence shows a poison prompt);
- :class:`GiveUpExhausted`: the prompt used up its infra budget (skipped, or the run ends: :mod:`drops` decides).

The charges follow the evidence: a data charge made by a shard since judged sick for that same failure is refunded
(moved to the infra budget), and a data verdict the shards do not agree on, or that comes from shards serving
nothing while others serve, is charged as infra instead (see ``blame``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, replace

from rollout_runtime.dispatch import blame
from rollout_runtime.dispatch.accounts import AttemptOutcome
from rollout_runtime.dispatch.budget import DataFailedDecision, ExhaustedDecision, PromptBudget, RetryDecision, decide
from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.failures import Diagnosis, FailureClass

__all__ = [
    "Action",
    "Busy",
    "Charge",
    "EndRun",
    "Evidence",
    "GiveUpData",
    "GiveUpExhausted",
    "Retry",
    "Settlement",
    "settle",
]

Charge = tuple[str, blame.Signature]
"""A data failure that carried an HTTP status: the shard that answered, and how."""


@dataclass(frozen=True, slots=True)
class EndRun:
    """The fleet is misconfigured: the run ends with the evidence (a session may end this prompt only)."""

    evidence: str


@dataclass(frozen=True, slots=True)
class Busy:
    """The shard is busy: the attempt taught the shard's room (``gate``); the prompt goes back at once and waits
    for room there, not for a Retry-After timer."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Another attempt after ``delay_seconds``; at once instead when ``at_once_elsewhere`` and, after the ejection,
    another shard can take it now (the failure was the shard's: the backoff would only protect a sick fleet)."""

    delay_seconds: float
    at_once_elsewhere: bool = False


@dataclass(frozen=True, slots=True)
class GiveUpData:
    """The prompt is data-failed; ``reason`` replaces the diagnosis' when the evidence says more."""

    reason: str | None = None


@dataclass(frozen=True, slots=True)
class GiveUpExhausted:
    """The prompt used up its infra budget."""


Action = EndRun | Busy | Retry | GiveUpData | GiveUpExhausted


@dataclass(frozen=True, slots=True)
class Settlement:
    """What one failed attempt comes to."""

    outcome: AttemptOutcome
    budget: PromptBudget
    data_charges: tuple[Charge, ...]
    eject: bool
    """The failure is the shard's: eject it (or hold it, when the panic rule keeps it in rotation)."""
    action: Action


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the run's evidence says about this prompt, read after the failure was recorded (see ``blame``)."""

    verdict: blame.Verdict
    sick: Collection[Charge] = ()
    """The prompt's data charges (this attempt's included) whose shard was since judged sick for that failure."""
    confirmed: bool = True
    """Every shard that gave this answer serves other prompts (:meth:`blame.Evidence.confirmed`)."""
    followed: bool = False
    """This non-transient answer is the only one the prompt got, from two or more shards
    (:meth:`blame.Evidence.followed`)."""

    @classmethod
    def read(
        cls,
        store: blame.Evidence,
        verdict: blame.Verdict,
        prompt: Hashable,
        sig: blame.Signature,
        charges: Sequence[Charge],
    ) -> Evidence:
        """What ``store`` says after ``verdict`` on a failure with ``sig``; ``charges`` are the prompt's data charges
        with this attempt's."""
        return cls(
            verdict,
            sick=[charge for charge in charges if store.judged_sick(*charge)],
            confirmed=store.confirmed(prompt, sig),
            followed=store.followed(prompt, sig),
        )


def settle(
    policy: DispatchPolicy,
    diagnosis: Diagnosis,
    sig: blame.Signature | None,
    evidence: Evidence,
    budget: PromptBudget,
    data_charges: tuple[Charge, ...],
    *,
    shard: str,
    tried: Sequence[str],
    immediate: bool = False,
    draw: Callable[[], float],
) -> Settlement:
    """Settle one failed attempt of a prompt on ``shard`` (see the module docstring).

    ``budget`` and ``data_charges`` are the prompt's before this attempt, ``tried`` the shards it went to;
    ``immediate``: the retry needs no backoff
    (the progress watchdog already waited); ``draw`` gives the backoff's jitter in [0, 1), asked once when the budgets
    decide.
    """
    kind = evidence.verdict.blame
    failure_class = FailureClass.DATA if kind is blame.Blame.POISON else diagnosis.failure_class
    if kind is blame.Blame.SICK_SHARD:
        failure_class = FailureClass.INFRA
    charges = data_charges
    outcome: AttemptOutcome
    if kind is blame.Blame.BACKPRESSURE:
        outcome, budget = "infra_failure", replace(budget, evictions=budget.evictions + 1)  # busy, not broken
    elif failure_class is FailureClass.INFRA:
        outcome, budget = "infra_failure", replace(budget, infra_failures=budget.infra_failures + 1)
    else:
        outcome, budget = "data_failure", replace(budget, data_failures=budget.data_failures + 1)
        if sig is not None and kind is blame.Blame.FIRST_VERDICT:
            charges = (*charges, (shard, sig))

    def settled(action: Action, eject: bool = False) -> Settlement:
        return Settlement(outcome, budget, charges, eject, action)

    if kind is blame.Blame.MISCONFIGURED:
        return settled(EndRun(evidence.verdict.evidence))
    if kind is blame.Blame.POISON:
        return settled(GiveUpData(f"{evidence.verdict.evidence}; {diagnosis.reason}"))
    if kind is blame.Blame.BACKPRESSURE:
        return settled(Busy())
    answered = blame.waits_for_evidence(sig)
    # An answer a poison prompt could explain ejects on evidence (a sick-shard verdict), not at once.
    eject = (diagnosis.blames_shard and not answered) or kind is blame.Blame.SICK_SHARD
    jitter = draw()
    if failure_class is FailureClass.DATA and charges:
        refunded = [charge for charge in charges if charge in evidence.sick]
        if refunded:
            charges = tuple(charge for charge in charges if charge not in refunded)
            budget = replace(
                budget,
                data_failures=budget.data_failures - len(refunded),
                infra_failures=budget.infra_failures + len(refunded),
            )
    decision = decide(policy, budget, failure_class, terminal=diagnosis.terminal, draw=jitter)
    disagree = len({charge for _, charge in charges}) > 1
    unconfirmed = sig is not None and (disagree or not evidence.confirmed)
    if isinstance(decision, DataFailedDecision) and not decision.terminal and unconfirmed:
        # Shards answered this prompt differently: that says the shards differ, not that the prompt is bad.
        budget = replace(budget, data_failures=budget.data_failures - 1, infra_failures=budget.infra_failures + 1)
        charges = charges[:-1]
        failure_class = FailureClass.INFRA
        decision = decide(policy, budget, failure_class, draw=jitter)
    if isinstance(decision, DataFailedDecision):
        return settled(GiveUpData(), eject)
    if isinstance(decision, ExhaustedDecision) and evidence.followed:
        # Every shard it went to gave the same non-transient answer and the fleet is not misconfigured: the prompt
        # is the common factor, even before those shards had served others.
        shards = ", ".join(sorted(set(tried)))
        return settled(GiveUpData(f"poison prompt: the same answer on shards {shards}; {diagnosis.reason}"), eject)
    if isinstance(decision, ExhaustedDecision):
        return settled(GiveUpExhausted(), eject)
    assert isinstance(decision, RetryDecision)
    if answered:
        # The shard answered (the fleet is up): the retry goes at once. The backoff protects a sick fleet from a
        # storm; a failure that is not the shard's (an environment server down) still backs off.
        return settled(Retry(0.0), eject)
    return settled(Retry(0.0 if immediate else decision.delay_seconds, at_once_elsewhere=eject), eject)
