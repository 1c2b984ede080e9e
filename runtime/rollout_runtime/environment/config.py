"""Protocol-neutral episode limits every environment server shares, validated once at startup.

A limit that cannot be honoured (a bounded concurrency with no bound on how long an episode may wait for it)
is a configuration error, not a runtime surprise: episodes would queue forever behind a hung one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["EnvironmentServerConfig"]

_MiB = 1024 * 1024


class EnvironmentServerConfig(BaseModel):
    """Configure protocol-neutral episode limits (and where the server listens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    """0 lets the operating system choose a free port; the bound port is reported after start."""

    max_concurrent_episodes: Annotated[int, Field(gt=0)] | None = None
    """Episodes running at once; None is unlimited. Further episodes wait in the admission queue."""
    max_queued_episodes: Annotated[int, Field(ge=0)] = 64
    """Episodes allowed to wait for a slot; one more is rejected at once (stage "admission", not terminal)."""
    admission_timeout_seconds: Annotated[float, Field(gt=0)] | None = None
    """How long an episode may wait for a slot; required once concurrency is limited."""

    default_episode_timeout_seconds: Annotated[float, Field(gt=0)] | None = None
    """Wall-clock bound of one episode (parked checkpoint time excluded); None is no bound."""
    cleanup_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    """Bound on each cleanup callback during final unwinding."""

    duplicate_attempt_wait_seconds: Annotated[float, Field(ge=0)] = 10.0
    """How long an attempt waits for a live attempt of the same ``episode_id`` to end before it is refused
    (409 ``episode_in_progress``, retried by the runtime as infra); 0 refuses at once."""
    remembered_episodes: Annotated[int, Field(ge=0)] = 1024
    """Finished episodes whose result a later attempt with the same id and input gets again (0: none)."""

    max_request_bytes: Annotated[int, Field(gt=0)] = 1 * _MiB
    """Larger episode requests are refused with 413 before they are parsed."""

    checkpoint_dir: Path | None = None
    """Where partial-rollout checkpoints are stored; None turns checkpointing off."""

    @model_validator(mode="after")
    def _admission_is_bounded(self) -> Self:
        if self.max_concurrent_episodes is not None and self.admission_timeout_seconds is None:
            raise ValueError(
                "admission_timeout_seconds is required when max_concurrent_episodes is set: "
                "otherwise episodes can wait for a slot forever behind a hung one"
            )
        return self
