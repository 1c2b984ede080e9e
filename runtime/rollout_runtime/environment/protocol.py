"""The typed episode protocol's base messages; concrete environments subclass both.

Requests forbid unknown fields, so a client typo is a clear 422 rather than a silently ignored option; replies
allow them, so a generic client can read any protocol's reply.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from rollout_runtime.environment.checkpoint.state import EPISODE_ID_PATTERN
from rollout_runtime.environment.episode_failure import EpisodeFailure, FailureReport

__all__ = ["EpisodeRequest", "EpisodeResponse"]


class EpisodeRequest(BaseModel):
    """One episode's input. Retry an episode with the same ``episode_id`` to continue its checkpoint."""

    model_config = ConfigDict(extra="forbid")

    episode_id: Annotated[str, Field(pattern=EPISODE_ID_PATTERN)] = Field(default_factory=lambda: uuid.uuid4().hex)


class EpisodeResponse(BaseModel):
    """One episode's reply: a reward, or a failure with its report beside it.

    Unknown fields are kept (``model_extra``): a client reading a richer protocol's reply with this base model
    must not fail on the fields it does not know.
    """

    model_config = ConfigDict(extra="allow")

    episode_id: str
    reward: float | None = None
    failure: EpisodeFailure | None = None
    failure_report: FailureReport | None = None
