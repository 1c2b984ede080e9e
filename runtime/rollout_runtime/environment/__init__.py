"""Environment servers: the shared lifecycle every environment server inherits, and the runtime's client.

Server side: :class:`BaseEnvironmentServer` (typed episodes over aiohttp, admission limits, episode timeouts,
per-episode :class:`EpisodeCleanupContext`, handled failures with a :class:`FailureReport`, partial-rollout
checkpoints, health and ``environment_*`` metrics). Client side: :class:`EnvironmentClient`, which fails only in
the runtime's failure taxonomy (infra vs data), already picklable.
"""

from __future__ import annotations

from rollout_runtime.environment.aggregation import RolloutScore, TaskMetrics, aggregate_rollout_scores
from rollout_runtime.environment.checkpoint import (
    CheckpointAborted,
    CheckpointCoordinator,
    CheckpointingOff,
    CheckpointManifest,
    CheckpointMismatch,
    CheckpointRecord,
    CheckpointStore,
    CorruptCheckpointError,
    EpisodeSteps,
    FilesystemCheckpointStore,
    MemoryCheckpointStore,
    ProtocolState,
    StepMode,
    seed_restarts,
)
from rollout_runtime.environment.cleanup import CleanupCallback, CleanupFailure, EpisodeCleanupContext
from rollout_runtime.environment.client import (
    EnvironmentClient,
    rollout_failure_for_episode,
    rollout_failure_for_http_error,
)
from rollout_runtime.environment.config import EnvironmentServerConfig
from rollout_runtime.environment.episode import EpisodeContext
from rollout_runtime.environment.episode_failure import (
    EpisodeFailure,
    FailureEvent,
    FailureReport,
    HandledEpisodeFailure,
    dependency_episode_failure,
    handled_episode_failure,
    is_handled_episode_failure,
    unhandled_episode_failure,
)
from rollout_runtime.environment.failures import (
    MAX_FAILURE_REASON_CHARS,
    DependencyResponseError,
    format_exception_with_response_body,
    is_retryable_dependency_error,
    is_retryable_dependency_status,
    raise_for_dependency_status,
)
from rollout_runtime.environment.limits import AdmissionLimiter, AdmissionRejected
from rollout_runtime.environment.metrics import EnvironmentMetrics
from rollout_runtime.environment.protocol import EpisodeRequest, EpisodeResponse
from rollout_runtime.environment.server import (
    BaseEnvironmentServer,
    EpisodeResult,
    RunningServer,
    setup_environment_app,
)

__all__ = [
    "MAX_FAILURE_REASON_CHARS",
    "AdmissionLimiter",
    "AdmissionRejected",
    "BaseEnvironmentServer",
    "CheckpointAborted",
    "CheckpointCoordinator",
    "CheckpointManifest",
    "CheckpointMismatch",
    "CheckpointRecord",
    "CheckpointStore",
    "CheckpointingOff",
    "CleanupCallback",
    "CleanupFailure",
    "CorruptCheckpointError",
    "DependencyResponseError",
    "EnvironmentClient",
    "EnvironmentMetrics",
    "EnvironmentServerConfig",
    "EpisodeCleanupContext",
    "EpisodeContext",
    "EpisodeFailure",
    "EpisodeRequest",
    "EpisodeResponse",
    "EpisodeResult",
    "EpisodeSteps",
    "FailureEvent",
    "FailureReport",
    "FilesystemCheckpointStore",
    "HandledEpisodeFailure",
    "MemoryCheckpointStore",
    "ProtocolState",
    "RolloutScore",
    "RunningServer",
    "StepMode",
    "TaskMetrics",
    "aggregate_rollout_scores",
    "dependency_episode_failure",
    "format_exception_with_response_body",
    "handled_episode_failure",
    "is_handled_episode_failure",
    "is_retryable_dependency_error",
    "is_retryable_dependency_status",
    "raise_for_dependency_status",
    "rollout_failure_for_episode",
    "rollout_failure_for_http_error",
    "seed_restarts",
    "setup_environment_app",
    "unhandled_episode_failure",
]
