"""What a partial-rollout checkpoint holds: the protocol state that names the next step, per episode."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

__all__ = [
    "EPISODE_ID_PATTERN",
    "CheckpointManifest",
    "CheckpointRecord",
    "ExportedEpisode",
    "ProtocolState",
    "StepMode",
    "input_digest",
]

EPISODE_ID_PATTERN: Final[str] = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""Episode ids name checkpoint files, so they are restricted to a safe file-name alphabet."""

StepMode = Literal["wait", "replay"]
"""``wait``: a checkpoint waits for the step to finish and record. ``replay``: safe to run again after a crash and
changes no checkpointed state, so a checkpoint does not wait for it; a restore runs it again."""


class ProtocolState(BaseModel):
    """The state a completed step records: the name of the next step and what it needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    next_step: Annotated[str, Field(min_length=1, max_length=256)]
    data: dict[str, JsonValue] = Field(default_factory=dict)


class CheckpointRecord(BaseModel):
    """One exported episode, as the store keeps it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    episode_id: Annotated[str, Field(pattern=EPISODE_ID_PATTERN)]
    protocol: str
    input_digest: str
    """Digest of the episode's input: a continuation for a different input is refused, not silently applied."""
    checkpoint_id: str
    steps_recorded: Annotated[int, Field(ge=0)]
    state: ProtocolState


class ExportedEpisode(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    next_step: str
    steps_recorded: int


class CheckpointManifest(BaseModel):
    """What one checkpoint exported: every parked episode's next step. Restart-only episodes are never in it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint_id: str
    episodes: dict[str, ExportedEpisode] = Field(default_factory=dict)


def input_digest(payload: dict[str, Any]) -> str:
    """A stable digest of an episode's input (canonical JSON, sorted keys, the episode id left out)."""
    canonical = json.dumps(
        {k: v for k, v in payload.items() if k != "episode_id"}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
