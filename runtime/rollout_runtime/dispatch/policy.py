"""The dispatcher's policy: budgets, backoff, ejection, stall watchdog; one validated object.

Every knob has the default DESIGN.md names. Cross-field rules are checked here, at construction, so a bad
policy fails when it is written rather than hours into a run (a stall deadline shorter than the attempt
timeout would abort runs that are merely slow).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DispatchPolicy"]

_Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class DispatchPolicy(BaseModel):
    """How hard the dispatcher tries, and when it gives up.

    Infra and data attempts are budgeted independently: a prompt may use up to ``max_infra_attempts`` attempts
    that failed for infrastructure reasons *and* up to ``max_data_attempts`` that failed for data reasons.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_infra_attempts: Annotated[int, Field(ge=1, le=1000)] = 5
    """Attempts a prompt may spend on infrastructure failures before it is exhausted."""
    max_data_attempts: Annotated[int, Field(ge=1, le=100)] = 2
    """Attempts a prompt may spend on data failures before it is reported data-failed."""

    backoff_initial_seconds: _Seconds = 1.0
    """Delay before the first infra redispatch; each further one multiplies it by ``backoff_multiplier``."""
    backoff_max_seconds: _Seconds = 30.0
    backoff_multiplier: Annotated[float, Field(ge=1, le=100, allow_inf_nan=False)] = 2.0
    backoff_jitter: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.5
    """Fraction of each delay that is randomised downwards: the delay lies in ``[d * (1 - jitter), d]``."""

    max_skipped_prompts: Annotated[int, Field(ge=0)] = 0
    """Prompts whose infra budget may run out (reported as skipped) before the run raises instead."""
    max_concurrency: Annotated[int, Field(ge=1)] | None = None
    """Attempts in flight at once across all shards; None means every prompt of a run at once."""
    attempt_timeout_seconds: _PositiveSeconds | None = None
    """Deadline of one attempt (None: unbounded); exceeding it is a RolloutTimeout (infra)."""
    healthy_wait_seconds: _Seconds = 30.0
    """How long an attempt waits for an eligible shard before failing with NoHealthyShards (infra)."""

    ejection_base_seconds: _PositiveSeconds = 30.0
    """First ejection of a shard lasts this long; repeated ones double it (Envoy's base_ejection_time)."""
    ejection_max_seconds: _PositiveSeconds = 300.0
    """Cap on one ejection; also the quiet period after which a shard's ejection count is forgotten."""
    max_ejection_percent: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 50.0
    """Share of the healthy set that may be ejected at once (at least one, never all: see ``ejection``)."""

    stall_deadline_seconds: _PositiveSeconds = 600.0
    """Rollouts unfinished but nothing committed for this long is a stall."""
    stall_check_seconds: _PositiveSeconds = 30.0
    stall_action: Literal["warn", "abort"] = "warn"
    """On a stall: log and count it ("warn"), or end the run with RolloutStall ("abort")."""

    failure_ledger_path: Path | None = None
    """JSON-lines file that receives every data-failed (and skipped) prompt; None keeps no ledger."""

    @model_validator(mode="after")
    def _coherent(self) -> DispatchPolicy:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError(
                f"backoff_max_seconds ({self.backoff_max_seconds}) must be >= backoff_initial_seconds "
                f"({self.backoff_initial_seconds})"
            )
        if self.ejection_max_seconds < self.ejection_base_seconds:
            raise ValueError(
                f"ejection_max_seconds ({self.ejection_max_seconds}) must be >= ejection_base_seconds "
                f"({self.ejection_base_seconds})"
            )
        if self.stall_check_seconds > self.stall_deadline_seconds:
            raise ValueError(
                f"stall_check_seconds ({self.stall_check_seconds}) must be <= stall_deadline_seconds "
                f"({self.stall_deadline_seconds}): the watchdog must look at least once per deadline"
            )
        timeout = self.attempt_timeout_seconds
        if timeout is not None and self.stall_deadline_seconds <= timeout:
            raise ValueError(
                f"stall_deadline_seconds ({self.stall_deadline_seconds}) must be longer than "
                f"attempt_timeout_seconds ({timeout}): otherwise one slow but legal attempt reads as a stall"
            )
        return self
