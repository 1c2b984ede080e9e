"""One episode's part in partial-rollout checkpoints: steps, recorded state, parking, continuation.

Rules a protocol follows:

- Do state-changing work in ``wait`` steps (the default) and :meth:`EpisodeSteps.record` the state each produced,
  naming the next step. Use ``replay`` only for a step that is safe to run again after a crash and changes no
  checkpointed state (a pure verifier, a read-only query): a checkpoint does not wait for it.
- At the start of a step and after recording, an episode parks while a checkpoint is open. Parked time does not
  count against the episode deadline.
- A replacement attempt that continues a checkpoint gets the latest exported state, once, from
  :meth:`EpisodeSteps.checkpoint_continuation`.
- An episode that depends on a server which cannot capture its part (a restart-only agent) calls
  :meth:`EpisodeSteps.mark_restart`: it then never holds up a checkpoint, is never exported, and after a crash is
  started over from its input.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from rollout_runtime.environment.attempts import Attempt
from rollout_runtime.environment.checkpoint.coordinator import CheckpointCoordinator
from rollout_runtime.environment.checkpoint.state import ProtocolState, StepMode

__all__ = ["CheckpointMismatch", "EpisodeSteps", "seed_restarts"]

T = TypeVar("T")
StateLike = ProtocolState | Mapping[str, Any]


class CheckpointMismatch(Exception):
    """A stored checkpoint for this episode id was recorded for a different input."""


def seed_restarts(seed_reply: Mapping[str, Any]) -> bool:
    """Whether a seed reply says its server cannot capture its part (``"checkpoint": "restart"``).

    Call :meth:`EpisodeSteps.mark_restart` when it does.
    """
    value = seed_reply.get("checkpoint")
    return isinstance(value, str) and value.lower() == "restart"


class EpisodeSteps:
    """Checkpoint participation of one episode. Inert (steps just run) when checkpointing is off."""

    def __init__(
        self,
        coordinator: CheckpointCoordinator,
        *,
        episode_id: str,
        input_digest: str,
        exported: bool = True,
        attempt: Attempt | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.attempt = attempt
        """The attempt these steps belong to (its fencing token); None: not fenced (used outside a server)."""
        self.episode_id = episode_id
        self.input_digest = input_digest
        self.busy = False
        self.finished = False
        self.restart = not exported
        self.latest: ProtocolState | None = None
        self.steps_recorded = 0
        self.parked = False
        self.deadline: asyncio.Timeout | None = None
        """The episode's deadline, paused while parked (set by the server)."""
        self._continuation: ProtocolState | None = None

    @property
    def owns_checkpoint(self) -> bool:
        """Whether these steps may export or drop the episode's stored record: only its live attempt's may."""
        return self.attempt is None or self.attempt.live

    @property
    def participating(self) -> bool:
        return self.coordinator.enabled and not self.restart and not self.finished

    async def start(self) -> None:
        """Join checkpoints and load this episode's exported state, if a previous attempt left one."""
        if not self.participating:
            return
        record = await self.coordinator.load(self)
        if record is not None:
            if record.input_digest != self.input_digest:
                raise CheckpointMismatch(
                    f"the checkpoint of episode {self.episode_id!r} was recorded for a different input; "
                    "refusing to continue it (use a new episode id, or delete the checkpoint)"
                )
            self._continuation = record.state
            self.latest = record.state
            self.steps_recorded = record.steps_recorded
        self.coordinator.track(self)

    async def finish(self, *, keep_checkpoint: bool) -> None:
        """Leave checkpoints. ``keep_checkpoint``: a retry may continue from the exported state (infra failure)."""
        if self.finished:
            return
        self.finished = True
        self.busy = False
        if keep_checkpoint:
            self.coordinator.untrack(self)
        else:
            await self.coordinator.forget(self)

    def checkpoint_continuation(self) -> ProtocolState | None:
        """Return the protocol state this attempt continues from a checkpoint, once, or None."""
        state, self._continuation = self._continuation, None
        return state

    async def mark_restart(self) -> None:
        """Mark this episode as a restart: never holds up a checkpoint, never exported, restarted after a crash."""
        if self.restart:
            return
        self.restart = True
        self.busy = False
        self._continuation = None
        if self.coordinator.enabled:
            await self.coordinator.forget(self)

    async def step(self, name: str, run: Callable[[], Awaitable[T]], *, mode: StepMode = "wait") -> T:
        """Run one protocol step as a ``wait`` or ``replay`` step (see the module docstring)."""
        if mode not in ("wait", "replay"):
            raise ValueError(f"step {name!r}: mode must be 'wait' or 'replay', got {mode!r}")
        await self._park_if_open()
        if mode == "wait" and self.participating:
            self.busy = True
        return await run()

    async def record(self, state: StateLike | Callable[[], StateLike]) -> None:
        """Record that a protocol step completed; ``state`` names the next step and what it needs.

        Pass a function when building state costs something: it is called only with checkpointing on.
        """
        if not self.participating:
            return
        if not self.busy:
            await self._park_if_open()  # after a replay step: do not change state under an open checkpoint
        value = state() if callable(state) else state
        self.latest = value if isinstance(value, ProtocolState) else ProtocolState.model_validate(value)
        self.steps_recorded += 1
        self.busy = False
        self.coordinator.notify()
        await self._park_if_open()

    async def _park_if_open(self) -> None:
        """While a checkpoint is open the episode parks here until resume (unless it is busy or a restart)."""
        if not self.participating or self.busy or not self.coordinator.is_open:
            return
        loop = asyncio.get_running_loop()
        deadline = self.deadline
        remaining: float | None = None
        if deadline is not None and not deadline.expired() and deadline.when() is not None:
            remaining = max(0.0, deadline.when() - loop.time())  # type: ignore[operator]
            deadline.reschedule(None)
        self.parked = True
        self.coordinator.notify()
        try:
            while self.coordinator.is_open:
                await self.coordinator.wait_resumed()
        finally:
            self.parked = False
            if deadline is not None and remaining is not None and not deadline.expired():
                deadline.reschedule(loop.time() + remaining)
