"""What a run hands back: one outcome per prompt, the run's counters, and events for live observers.

A data failure is a distinct type, never a :class:`Completed` with an empty result, so a trainer cannot
mistake it for a zero-reward sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from rollout_runtime.failures import FailureClass

__all__ = [
    "AttemptEnded",
    "Completed",
    "DataFailed",
    "DispatchEvent",
    "HealthyShardsChanged",
    "Outcome",
    "PromptId",
    "RunStats",
    "ShardEjected",
    "ShardQuarantined",
    "ShardRestored",
    "Skipped",
    "StallDetected",
]

P = TypeVar("P")
R = TypeVar("R")
PromptId = int | str


@dataclass(frozen=True, slots=True)
class Completed(Generic[P, R]):
    """The prompt's rollout succeeded on ``shard`` after ``attempts`` attempts (1 = first try), with the shard's
    weights at policy ``weights_version`` (None when weights are not tracked or the version is unknown)."""

    prompt_id: PromptId
    prompt: P
    result: R
    attempts: int
    shard: str
    weights_version: int | None = None
    quality: str | None = None
    """None: nothing is known against this result. Otherwise the signal (``empty``, ``length``, ``mismatch``...) on
    which its shard was quarantined before the result arrived: it came from the shard's suspect window, and the
    trainer decides whether to train on it (see :class:`ShardQuarantined`)."""


@dataclass(frozen=True, slots=True)
class DataFailed(Generic[P]):
    """The prompt cannot be rolled out: its data budget ran out or a failure forbade retrying. Never train on it."""

    prompt_id: PromptId
    prompt: P
    failure_class: FailureClass
    failure_type: str
    reason: str
    attempts: int
    shards: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Skipped(Generic[P]):
    """The prompt used up its infra budget, and the policy allowed skipping it instead of ending the run."""

    prompt_id: PromptId
    prompt: P
    failure_type: str
    reason: str
    attempts: int
    shards: tuple[str, ...]


Outcome = Completed[P, R] | DataFailed[P] | Skipped[P]


@dataclass(slots=True)
class RunStats:
    """Counters of one run. Invariant once it ends: ``submitted == completed + data_failed + skipped + aborted``.

    ``aborted`` counts prompts that were unfinished when the run raised (or was closed early). ``submitted`` counts
    the run's prompts and the reserve prompts it drew (``on_dropped_prompt="replace"``); undrawn ones are not the run's.
    """

    submitted: int = 0
    completed: int = 0
    data_failed: int = 0
    skipped: int = 0
    aborted: int = 0
    successes: int = 0
    infra_failures: int = 0
    data_failures: int = 0
    cancelled: int = 0
    """Attempts cancelled because their shard left the healthy set (redispatched, charged to no budget)."""
    stale: int = 0
    """Answers not committed because the shard's weights were outside ``max_weights_lag``, unknown or changed
    mid-attempt (redispatched, infra, charged to no budget)."""
    committed_by_version: dict[int | None, int] = field(default_factory=dict)
    """Completed prompts by the weights version that produced them (None: not tracked or unknown)."""
    redispatches: int = 0
    exhausted: int = 0
    ejections: int = 0
    stalls: int = 0
    in_flight: int = 0
    hedges: int = 0
    """Second attempts started by hedging (``DispatchPolicy.hedge_factor``); each also counts as an attempt."""
    hedges_wasted: int = 0
    """Hedged pairs whose loser was cancelled after the winner answered: the price of hedging."""

    @property
    def attempts(self) -> int:
        return self.successes + self.infra_failures + self.data_failures + self.cancelled + self.stale

    @property
    def finished(self) -> int:
        return self.completed + self.data_failed + self.skipped

    @property
    def unfinished(self) -> int:
        return self.submitted - self.finished - self.aborted


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    prompt_id: PromptId
    shard: str | None
    outcome: Literal["success", "infra_failure", "data_failure", "cancelled", "stale"]
    failure_type: str | None
    seconds: float


@dataclass(frozen=True, slots=True)
class ShardEjected:
    shard: str
    seconds: float
    count: int


@dataclass(frozen=True, slots=True)
class ShardQuarantined:
    """``shard`` answered 200 with outputs unlike those of its peers on the same weights ``version``
    (:mod:`~rollout_runtime.dispatch.quality`): it is ejected for ``seconds`` (``count`` in a row) like a sick shard.

    ``prompt_ids`` are the prompts whose results it produced in its recent window, as far as this dispatcher still
    knows them: already handed out as :class:`Completed`, they may be in the trainer's batch; it decides."""

    shard: str
    version: int | None
    signal: str
    test: str
    p_value: float
    threshold: float
    effect: float
    evidence: Mapping[str, float]
    peers: tuple[str, ...]
    seconds: float
    count: int
    prompt_ids: tuple[PromptId, ...]


@dataclass(frozen=True, slots=True)
class ShardRestored:
    shard: str
    reason: Literal["expired", "probe", "served"]
    """The ejection ran out; a probe passed after it; or (panic mode) an attempt started after it succeeded."""


@dataclass(frozen=True, slots=True)
class HealthyShardsChanged:
    revision: str
    healthy: tuple[str, ...]
    routable: tuple[str, ...]
    """Healthy minus ejected (all healthy ones in panic mode)."""


@dataclass(frozen=True, slots=True)
class StallDetected:
    action: Literal["warn", "abort"]
    idle_seconds: float
    unfinished: int


DispatchEvent = AttemptEnded | ShardEjected | ShardQuarantined | ShardRestored | HealthyShardsChanged | StallDetected
