"""The redispatch engine: budgets, backoff, selection, passive ejection, stall watchdog and accounting.

The rules (``budget``, ``blame``, ``settle``, ``drops``, ``ejection``, ``selection``, ``deadlines``, ``share``) are
pure: values in, decisions out. Around them, each part readable in one sitting: ``engine`` (the :class:`Dispatcher`:
public API, lifecycle, the worker loop that ties the parts together), ``run`` and ``session`` (a run's prompts and
lifecycle), ``accounts`` (the one accounting path), ``rotation`` (ejections, holds, trials, panic mode, pacing) and
``attempt`` (one attempt: timeout, progress watchdog, hedging, weights check).
"""

from rollout_runtime.dispatch.budget import (
    DataFailedDecision,
    Decision,
    ExhaustedDecision,
    PromptBudget,
    RetryDecision,
    backoff_seconds,
    decide,
)
from rollout_runtime.dispatch.clock import Clock, LoopClock
from rollout_runtime.dispatch.drops import DropCounts, DropDecision, batch_floor, decide_drop
from rollout_runtime.dispatch.ejection import Ejection, EjectionTracker, max_ejectable
from rollout_runtime.dispatch.engine import Dispatcher, DispatchRun, Rollout
from rollout_runtime.dispatch.ledger import FailureLedger, LedgerEntry
from rollout_runtime.dispatch.outcomes import (
    AttemptEnded,
    Completed,
    DataFailed,
    DispatchEvent,
    HealthyShardsChanged,
    Outcome,
    PromptId,
    RunStats,
    ShardEjected,
    ShardQuarantined,
    ShardRestored,
    Skipped,
    StallDetected,
)
from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.dispatch.progress import report_progress
from rollout_runtime.dispatch.quality import QualityDetector, QualitySettings, QualityVerdict, Sample, samples_of
from rollout_runtime.dispatch.selection import ShardLoad, pick_shard
from rollout_runtime.dispatch.session import DispatchSession, SessionClosed
from rollout_runtime.dispatch.watchdog import StallVerdict, StallWatchdog, watch

__all__ = [
    "AttemptEnded",
    "Clock",
    "Completed",
    "DataFailed",
    "DataFailedDecision",
    "Decision",
    "DispatchEvent",
    "DispatchPolicy",
    "DispatchRun",
    "DispatchSession",
    "Dispatcher",
    "DropCounts",
    "DropDecision",
    "Ejection",
    "EjectionTracker",
    "ExhaustedDecision",
    "FailureLedger",
    "HealthyShardsChanged",
    "LedgerEntry",
    "LoopClock",
    "Outcome",
    "PromptBudget",
    "PromptId",
    "QualityDetector",
    "QualitySettings",
    "QualityVerdict",
    "RetryDecision",
    "Rollout",
    "RunStats",
    "Sample",
    "SessionClosed",
    "ShardEjected",
    "ShardLoad",
    "ShardQuarantined",
    "ShardRestored",
    "Skipped",
    "StallDetected",
    "StallVerdict",
    "StallWatchdog",
    "backoff_seconds",
    "batch_floor",
    "decide",
    "decide_drop",
    "max_ejectable",
    "pick_shard",
    "report_progress",
    "samples_of",
    "watch",
]
