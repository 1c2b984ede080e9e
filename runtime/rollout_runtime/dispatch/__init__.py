"""The redispatch engine: budgets, backoff, selection, passive ejection, stall watchdog and accounting.

Everything but :mod:`engine` is pure (decisions as values); the engine is the thin async shell around them.
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
    ShardRestored,
    Skipped,
    StallDetected,
)
from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.dispatch.progress import report_progress
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
    "RetryDecision",
    "Rollout",
    "RunStats",
    "SessionClosed",
    "ShardEjected",
    "ShardLoad",
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
    "watch",
]
