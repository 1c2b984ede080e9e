"""Partial-rollout checkpoints: steps, park/resume, wait vs replay, restart-only episodes, durable stores."""

from __future__ import annotations

from rollout_runtime.environment.checkpoint.coordinator import (
    CheckpointAborted,
    CheckpointCoordinator,
    CheckpointingOff,
)
from rollout_runtime.environment.checkpoint.state import (
    EPISODE_ID_PATTERN,
    CheckpointManifest,
    CheckpointRecord,
    ExportedEpisode,
    ProtocolState,
    StepMode,
    input_digest,
)
from rollout_runtime.environment.checkpoint.steps import CheckpointMismatch, EpisodeSteps, seed_restarts
from rollout_runtime.environment.checkpoint.store import (
    CheckpointStore,
    CheckpointStoreError,
    CorruptCheckpointError,
    FilesystemCheckpointStore,
    MemoryCheckpointStore,
)

__all__ = [
    "EPISODE_ID_PATTERN",
    "CheckpointAborted",
    "CheckpointCoordinator",
    "CheckpointManifest",
    "CheckpointMismatch",
    "CheckpointRecord",
    "CheckpointStore",
    "CheckpointStoreError",
    "CheckpointingOff",
    "CorruptCheckpointError",
    "EpisodeSteps",
    "ExportedEpisode",
    "FilesystemCheckpointStore",
    "MemoryCheckpointStore",
    "ProtocolState",
    "StepMode",
    "input_digest",
    "seed_restarts",
]
