"""What a running episode sees: its cleanup context and its part in checkpoints, in one handle."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from rollout_runtime.environment.checkpoint.state import ProtocolState, StepMode
from rollout_runtime.environment.checkpoint.steps import EpisodeSteps, StateLike
from rollout_runtime.environment.cleanup import CleanupCallback, CleanupFn, EpisodeCleanupContext

__all__ = ["EpisodeContext"]

T = TypeVar("T")


class EpisodeContext:
    """Handed to :meth:`BaseEnvironmentServer.run_episode`; thin delegation to cleanup and steps."""

    def __init__(self, episode_id: str, *, cleanup: EpisodeCleanupContext, steps: EpisodeSteps) -> None:
        self.episode_id = episode_id
        self.cleanup = cleanup
        self.steps = steps

    def register_cleanup(self, fn: CleanupFn, *, name: str | None = None) -> CleanupCallback:
        """Register a release action for something this episode acquired (LIFO, bounded, at most once)."""
        return self.cleanup.register(fn, name=name)

    async def step(self, name: str, run: Callable[[], Awaitable[T]], *, mode: StepMode = "wait") -> T:
        return await self.steps.step(name, run, mode=mode)

    async def record(self, state: StateLike | Callable[[], StateLike]) -> None:
        await self.steps.record(state)

    def checkpoint_continuation(self) -> ProtocolState | None:
        return self.steps.checkpoint_continuation()

    async def mark_restart(self) -> None:
        await self.steps.mark_restart()
