"""A run's accounts: the one place an outcome is counted, into its :class:`RunStats`, the ``rollout_*`` metrics,
the observer and the failure ledger together.

No outcome path updates those by hand, so they cannot disagree. ``stats.in_flight`` is the only count of attempts in
flight: the dispatcher's ``in_flight`` and the ``rollout_in_flight`` gauge are sums of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

from rollout_runtime.dispatch.clock import Clock
from rollout_runtime.dispatch.ejection import Ejection
from rollout_runtime.dispatch.ledger import FailureLedger, LedgerEntry, preview, stale_by_version
from rollout_runtime.dispatch.outcomes import (
    AttemptEnded,
    Completed,
    DataFailed,
    DispatchEvent,
    Outcome,
    PromptId,
    RunStats,
    ShardEjected,
    Skipped,
    StallDetected,
)
from rollout_runtime.dispatch.watchdog import StallVerdict, StallWatchdog
from rollout_runtime.failures import Diagnosis, FailureClass
from rollout_runtime.metrics import RolloutMetrics
from rollout_runtime.weights.gate import WeightsVerdict, lag_label

__all__ = ["Accounts", "AttemptOutcome"]

log = logging.getLogger("rollout_runtime.dispatch")

AttemptOutcome = Literal["success", "infra_failure", "data_failure", "cancelled", "stale"]
"""How one attempt ended (the ``outcome`` label of ``rollout_attempts_total``)."""


class Accounts:
    """The one accounting path of a run: each outcome goes to its stats, the metrics, the observer and the ledger here.

    No outcome path updates those by hand, so they cannot disagree. ``stats.in_flight`` is the only count of
    attempts in flight: the dispatcher's and the ``rollout_in_flight`` gauge are sums of it.
    """

    __slots__ = ("_clock", "_emit", "_ledger", "_metrics", "stats", "watchdog")

    def __init__(
        self,
        stats: RunStats,
        metrics: RolloutMetrics,
        clock: Clock,
        emit: Callable[[DispatchEvent], None] | None,
        ledger: FailureLedger | None,
    ) -> None:
        self.stats = stats
        self.watchdog: StallWatchdog | None = None
        self._metrics = metrics
        self._clock = clock
        self._emit = emit
        self._ledger = ledger

    def run_started(self) -> None:
        if self._metrics.last_commit_timestamp is None:
            # Progress is measured from the first run's start, so a run that never commits still shows as a stall.
            self._metrics.last_commit_timestamp = self._clock.wall()

    def attempt_started(self) -> None:
        self.stats.in_flight += 1

    def attempt_stopped(self) -> None:
        """The attempt no longer runs; how it ended is recorded apart, and only while the run still wants it."""
        self.stats.in_flight -= 1

    def attempt_ended(
        self,
        outcome: AttemptOutcome,
        prompt_id: PromptId,
        shard: str | None,
        seconds: float | None,
        diagnosis: Diagnosis | None = None,
    ) -> None:
        """An attempt ended; ``seconds`` is None when it never reached a shard (no duration to observe)."""
        self._count_attempt(outcome, seconds)
        if diagnosis is not None:
            self._metrics.failure(diagnosis.failure_class.value, diagnosis.failure_type)
        if self._emit is not None:
            kind = diagnosis.failure_type if diagnosis is not None else None
            self._emit(AttemptEnded(prompt_id, shard, outcome, kind, seconds or 0.0))

    def attempt_abandoned(self) -> None:
        """An attempt cut off by its own run's end: counted as cancelled, with no duration and no event."""
        self._count_attempt("cancelled", None)

    def _count_attempt(self, outcome: AttemptOutcome, seconds: float | None) -> None:
        stats = self.stats
        if outcome == "success":
            stats.successes += 1
        elif outcome == "infra_failure":
            stats.infra_failures += 1
        elif outcome == "data_failure":
            stats.data_failures += 1
        elif outcome == "stale":
            stats.stale += 1
        else:
            stats.cancelled += 1
        self._metrics.attempt(outcome, seconds)

    def prompt_ended(self, outcome: Outcome[Any, Any], stale_versions: Mapping[int | None, int] | None = None) -> None:
        """A prompt has its outcome; one that completed or data-failed is progress (for the stall watchdog and
        ``rollout_last_commit_timestamp_seconds``)."""
        stats, metrics = self.stats, self._metrics
        if isinstance(outcome, Completed):
            stats.completed += 1
            metrics.prompts["completed"] += 1
        elif isinstance(outcome, DataFailed):
            self._report(outcome, stale_versions)
            stats.data_failed += 1
            metrics.prompts["data_failed"] += 1
        else:
            self._report(outcome, stale_versions)
            stats.skipped += 1
            metrics.prompts["skipped"] += 1
            return
        metrics.last_commit_timestamp = self._clock.wall()
        if self.watchdog is not None:
            self.watchdog.committed(self._clock.monotonic())

    def _report(
        self, outcome: DataFailed[Any] | Skipped[Any], stale_versions: Mapping[int | None, int] | None = None
    ) -> None:
        """Log and ledger a prompt that ended without a result, before it is counted: a ledger that cannot be
        written ends the run with this prompt aborted, not both aborted and counted."""
        result: Literal["data_failed", "skipped"]
        if isinstance(outcome, DataFailed):
            result, verb, cls = "data_failed", "data-failed", outcome.failure_class
        else:
            result, verb, cls = "skipped", "skipped", FailureClass.INFRA
        log.warning("prompt %s %s after %d attempt(s): %s", outcome.prompt_id, verb, outcome.attempts, outcome.reason)
        if self._ledger is None:
            return
        self._ledger.write(
            LedgerEntry(
                prompt_id=outcome.prompt_id,
                result=result,
                failure_class=cls.value,
                failure_type=outcome.failure_type,
                reason=outcome.reason,
                attempts=outcome.attempts,
                shards=outcome.shards,
                time=self._clock.wall(),
                prompt_preview=preview(outcome.prompt),
                stale_by_version=stale_by_version(stale_versions or {}),
            )
        )

    def committed(self, verdict: WeightsVerdict) -> None:
        """A result is about to be committed: count it by weights version and lag."""
        by_version = self.stats.committed_by_version
        by_version[verdict.version] = by_version.get(verdict.version, 0) + 1
        self._metrics.committed(lag_label(verdict.lag))

    def hedged(self) -> None:
        """A hedge (a second attempt of a slow one, on another shard) started."""
        self.stats.hedges += 1

    def hedge_wasted(self) -> None:
        """One of a hedged pair answered while the other still ran: the other's work is wasted."""
        self.stats.hedges_wasted += 1

    def redispatched(self) -> None:
        self.stats.redispatches += 1
        self._metrics.redispatches += 1

    def exhausted(self) -> None:
        """A prompt used up its infra budget (it is then skipped, or the run ends)."""
        self.stats.exhausted += 1
        self._metrics.exhausted += 1

    def ejected(self, shard: str, ejection: Ejection) -> None:
        self.stats.ejections += 1
        self._metrics.ejection(shard)
        if self._emit is not None:
            self._emit(ShardEjected(shard, ejection.seconds, ejection.count))

    def stalled(self, verdict: StallVerdict) -> None:
        self.stats.stalls += 1
        self._metrics.stalls[verdict.action] += 1
        if self._emit is not None:
            self._emit(StallDetected(verdict.action, verdict.idle_seconds, verdict.unfinished))
