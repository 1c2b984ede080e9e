"""The dispatcher's policy: budgets, backoff, ejection, stall watchdog; one validated object.

Every knob has the default DESIGN.md names. Cross-field rules (:data:`POLICY_RULES`) are checked here, at
construction, so a bad policy fails when it is written rather than hours into a run (a stall deadline shorter than
the attempt timeout would abort runs that are merely slow). This model is also the one definition of a
RolloutFleet's ``spec.policy``: the operator derives the CRD schema, its CEL rules and its defaults from it and
:data:`FLEET_POLICY`, and :meth:`DispatchPolicy.from_fleet` reads such a policy back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rollout_runtime.schema import ClusterView, Comparison, Requirement, Rule, rules_validator

__all__ = ["FLEET_POLICY", "POLICY_RULES", "DispatchPolicy"]

# Upper bounds are finite so the CRD generated from this model is cheap for the API server's CEL cost estimate.
_Seconds = Annotated[float, Field(ge=0, le=86_400, allow_inf_nan=False)]
_PositiveSeconds = Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)]

POLICY_RULES: Final[tuple[Rule, ...]] = (
    Comparison(
        "stall_deadline_seconds",
        ">",
        "attempt_timeout_seconds",
        "or the watchdog fires while a healthy attempt is still within its deadline",
    ),
    Comparison("stall_check_seconds", "<=", "stall_deadline_seconds", "or a stall can go unseen"),
    Comparison("backoff_max_seconds", ">=", "backoff_initial_seconds"),
    Comparison("ejection_max_seconds", ">=", "ejection_base_seconds"),
    Comparison("progress_cap_seconds", ">=", "progress_floor_seconds"),
    Requirement(
        "on_dropped_prompt",
        "replace",
        "max_replacement_attempts",
        ">=",
        1,
        "or no replacement is ever dispatched, which is on_dropped_prompt='shrink'",
    ),
    Requirement(
        "on_dropped_prompt",
        "replace",
        "replacement_reserve_prompts",
        ">=",
        1,
        "or a run may be started with no reserve, and every replacement falls back to shrinking",
    ),
)
"""The cross-field rules: checked at construction here and, as CEL, by the API server on a RolloutFleet."""


class DispatchPolicy(BaseModel):
    """How hard the dispatcher tries, and when it gives up.

    Infra and data attempts are budgeted independently: a prompt may use up to ``max_infra_attempts`` attempts
    that failed for infrastructure reasons *and* up to ``max_data_attempts`` that failed for data reasons.
    A RolloutFleet's ``spec.policy`` is these fields in camelCase (see :data:`FLEET_POLICY` and :meth:`from_fleet`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_infra_attempts: Annotated[int, Field(ge=1, le=1000)] = 5
    """Attempts a prompt may spend on infrastructure failures before it is exhausted."""
    max_data_attempts: Annotated[int, Field(ge=1, le=100)] = 2
    """Attempts a prompt may spend on data failures before it is reported data-failed."""

    backoff_initial_seconds: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] = 1.0
    """Delay before the first infra redispatch; each further one is multiplied by the backoff multiplier."""
    backoff_max_seconds: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] = 30.0
    """Cap on one backoff delay."""
    backoff_multiplier: Annotated[float, Field(ge=1, le=100, allow_inf_nan=False)] = 2.0
    """Factor between consecutive backoff delays."""
    backoff_jitter: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.5
    """Fraction of each delay that is randomised downwards: the delay lies in [d * (1 - jitter), d]."""

    attempt_timeout_seconds: _PositiveSeconds | None = None
    """Deadline of one attempt; exceeding it is a RolloutTimeout (infra). A RolloutFleet defaults it to 300 s;
    DispatchPolicy() leaves it unset (unbounded)."""
    max_concurrency: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    """Attempts in flight at once across all shards; unset means every prompt of a run at once."""
    max_skipped_prompts: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    """Prompts whose data budget may run out (reported as DataFailed) over the dispatcher's lifetime before the run
    raises RolloutDataFailure; 0 fails on the first one (NeMo-RL's name and default: a dataset does not get better)."""
    max_consecutive_dropped_prompts: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    """Prompts in a row whose infra budget may run out (reported as Skipped) before the run raises
    RolloutRedispatchExhausted; any completed prompt resets the count, so this bounds an outage, not the run."""
    min_step_batch_fraction: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.9
    """A run (one training step) of N prompts fails with RolloutBatchTooSmall as soon as fewer than
    ceil(fraction * N) of them can still complete: the drop budgets span runs and cannot bound how short one gets."""
    on_dropped_prompt: Literal["shrink", "replace"] = "shrink"
    """What a prompt given up on (DataFailed or Skipped) costs its run: one fewer result (shrink), or a prompt from
    the run's reserve in its place (replace; see Dispatcher.run), falling back to shrink when none is left."""
    max_replacement_attempts: Annotated[int, Field(ge=0, le=1000)] = 1
    """Reserve prompts one batch position may draw in turn before it shrinks; read only with replace."""
    replacement_reserve_prompts: Annotated[int, Field(ge=0, le=1_000_000)] = 1
    """Fewest reserve prompts a run must be given with replace (Dispatcher.run raises otherwise)."""
    healthy_wait_seconds: _Seconds = 30.0
    """How long an attempt waits for an eligible shard before failing with NoHealthyShards (infra)."""

    ejection_base_seconds: _PositiveSeconds = 30.0
    """First passive ejection of a shard lasts this long; repeated ones double it (Envoy's base_ejection_time)."""
    ejection_max_seconds: _PositiveSeconds = 300.0
    """Cap on one ejection; also the quiet period after which a shard's ejection count is forgotten."""
    max_ejection_percent: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 50.0
    """Share of the healthy set that may be ejected at once (at least one shard, never all). A shard failing beyond it
    is held instead: no new attempt for the backoff of its failures in a row."""

    quality_false_positive_rate: Annotated[float, Field(ge=0, le=0.01, allow_inf_nan=False)] = 1e-6
    """Probability that one check of a healthy shard's outputs against its same-version peers quarantines it
    (dispatch/quality.py; a check every 25 of a shard's samples and reported mismatches); 0 turns gray-failure
    quarantine off. At 1e-6 ten million samples, each with a reported mismatch, expect at most 0.8 false quarantines
    (measured: 0 in 160,000), and a shard whose every output is off by one peer standard deviation is still found
    within 38 of its samples (docs/benchmarks.md)."""

    stall_deadline_seconds: Annotated[float, Field(gt=0, le=604_800, allow_inf_nan=False)] = 600.0
    """Rollouts unfinished but nothing committed for this long is a stall."""
    stall_check_seconds: Annotated[float, Field(ge=0.01, le=86_400, allow_inf_nan=False)] = 30.0
    """How often the stall watchdog looks; at least 10 ms, since a check every 1e-300 s is a busy loop."""
    stall_action: Literal["warn", "abort"] = "warn"
    """On a stall: log and count it (warn), or end the run with RolloutStall (abort)."""

    progress_watchdog: bool = False
    """Abandon an attempt whose shard went quiet longer than its own recent timings allow: no token (streamed) or
    no answer (not streamed) for ``progress_factor`` x the shard's p99 gap, clamped to the floor and cap. The attempt
    fails as RolloutTimeout, the shard is suspected (ejected per the ejection fields) and the prompt is redispatched
    at once."""
    progress_factor: Annotated[float, Field(ge=1, le=1000, allow_inf_nan=False)] = 8.0
    """Multiple of a shard's recent p99 inter-token gap (or time to first progress) an attempt may stay quiet."""
    progress_floor_seconds: _PositiveSeconds = 1.0
    """The progress deadline is never shorter than this (a fast shard's jitter is not a stall)."""
    progress_cap_seconds: _PositiveSeconds = 60.0
    """The progress deadline is never longer than this; a shard with too few timings gets exactly this."""
    hedge_factor: Annotated[float, Field(ge=1, le=1000, allow_inf_nan=False)] | None = None
    """Opt-in hedging: an attempt still running after its shard's p99 latency x this starts a second attempt on
    another shard; the first answer wins, the other is cancelled and counted in ``RunStats.hedges_wasted``."""
    max_weights_lag: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    """Policy versions a shard's weights may lag the trainer's when its answer arrives for the result to be
    committed (0: on-policy only). Answers outside it, or from a shard whose weights are unknown or changed
    mid-attempt, are redispatched as stale attempts (no budget charged). Only applies once the trainer publishes a
    policy version (rollout_runtime.weights)."""

    failure_ledger_path: Path | None = None
    """JSON-lines file that receives every data-failed (and skipped) prompt; None keeps no ledger."""

    _rules = rules_validator(POLICY_RULES)

    @classmethod
    def from_fleet(cls, spec_policy: Mapping[str, Any], **overrides: Any) -> DispatchPolicy:
        """A RolloutFleet's ``spec.policy`` (camelCase, as the API server stores it) as a DispatchPolicy.

        ``overrides`` are snake_case fields that win (the trainer's own choices, such as ``failure_ledger_path``).
        A field the fleet's schema does not have is an error, not dropped: a runtime older than the CRD must not
        run with a policy it half understood.
        """
        names = {to_camel(name): name for name in cls.model_fields if name not in FLEET_POLICY.excluded}
        unknown = sorted(set(spec_policy) - set(names))
        if unknown:
            raise ValueError(
                f"RolloutFleet spec.policy has fields this runtime does not know: {', '.join(unknown)}"
                f" (known: {', '.join(names)})"
            )
        fields = {**FLEET_POLICY.defaults, **{names[key]: value for key, value in spec_policy.items()}}
        return cls(**{**fields, **overrides})


FLEET_POLICY: Final[ClusterView] = ClusterView(
    scope="policy",
    rules=POLICY_RULES,
    defaults={"attempt_timeout_seconds": 300.0},
    excluded=frozenset({"failure_ledger_path"}),
)
"""A RolloutFleet's ``spec.policy`` against this model: in a cluster an attempt is bounded by default (a hung shard
must not hold a prompt forever), and a cluster object cannot name a file on the trainer's machine."""
