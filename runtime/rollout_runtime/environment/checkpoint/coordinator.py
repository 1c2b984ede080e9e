"""Open a partial-rollout checkpoint: park every episode at a step boundary, export their states, resume.

An episode holds up a checkpoint only while it is *busy*: from the start of a ``wait`` step until it records the
state that step produced. Parked episodes, episodes running a ``replay`` step, episodes that have not started a
step, and restart-only episodes never hold it up. Once no tracked episode is busy, every tracked episode with a
recorded state is written to the store; the manifest names them. Episodes stay parked until :meth:`resume`.

Every store call goes through the coordinator: an ``OSError`` from the store becomes a
:class:`~rollout_runtime.environment.checkpoint.store.CheckpointStoreError` (an infra failure with its reason), and
only an episode's live attempt (its fencing token, see :mod:`rollout_runtime.environment.attempts`) may export or
drop that episode's record.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from rollout_runtime.environment.checkpoint.state import CheckpointManifest, CheckpointRecord, ExportedEpisode
from rollout_runtime.environment.checkpoint.store import CheckpointStore, CheckpointStoreError

if TYPE_CHECKING:
    from rollout_runtime.environment.checkpoint.steps import EpisodeSteps

__all__ = ["CheckpointAborted", "CheckpointCoordinator", "CheckpointingOff"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class CheckpointingOff(RuntimeError):
    """A checkpoint was requested from a server that has no checkpoint store."""


class CheckpointAborted(RuntimeError):
    """The checkpoint was resumed before its export completed."""


class CheckpointCoordinator:
    """Tracks the episodes that take part in checkpoints and runs open/export/resume."""

    def __init__(
        self,
        store: CheckpointStore | None,
        *,
        protocol: str = "",
        on_store_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.protocol = protocol
        self._on_store_failure = on_store_failure
        """Told the operation (``load``, ``save``, ``delete``) of every store call that failed."""
        self._participants: set[EpisodeSteps] = set()
        self._open = False
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._changed = asyncio.Event()
        self._export: asyncio.Task[CheckpointManifest] | None = None
        self._store_lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return self.store is not None

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def tracked(self) -> int:
        return len(self._participants)

    def track(self, steps: EpisodeSteps) -> None:
        self._participants.add(steps)
        self.notify()

    def untrack(self, steps: EpisodeSteps) -> None:
        self._participants.discard(steps)
        self.notify()

    def notify(self) -> None:
        """An episode's busy state changed: let a pending export re-check."""
        self._changed.set()

    async def wait_resumed(self) -> None:
        await self._resumed.wait()

    def begin(self) -> None:
        """Open a checkpoint (no-op if one is open): episodes park from their next boundary on."""
        if self.store is None:
            raise CheckpointingOff("checkpointing is off: this server has no checkpoint store (--checkpoint-dir)")
        if not self._open:
            self._open = True
            self._resumed.clear()
        if self._export is None or self._export_failed():
            # a fresh checkpoint, or a retry after an export that failed (disk full): episodes stay parked meanwhile
            self._export = asyncio.get_running_loop().create_task(self._run_export(), name="checkpoint-export")

    def _export_failed(self) -> bool:
        export = self._export
        return export is not None and export.done() and not export.cancelled() and export.exception() is not None

    async def open(self) -> CheckpointManifest:
        """Open a checkpoint (or join the open one) and return its manifest once exported."""
        self.begin()
        export = self._export
        assert export is not None
        try:
            return await asyncio.shield(export)
        except asyncio.CancelledError:
            if export.cancelled():
                raise CheckpointAborted("the checkpoint was resumed before its export completed") from None
            raise

    def resume(self) -> bool:
        """Release parked episodes; returns whether a checkpoint was open."""
        was_open = self._open
        self._open = False
        if self._export is not None and not self._export.done():
            self._export.cancel()
        self._export = None
        self._resumed.set()
        return was_open

    async def load(self, steps: EpisodeSteps) -> CheckpointRecord | None:
        """The record a previous attempt left, once the store is known to be able to drop it again."""
        store = self.store
        assert store is not None
        ensure_writable: Callable[[], Awaitable[None]] | None = getattr(store, "ensure_writable", None)
        if ensure_writable is not None:
            await self._storage("load", steps.episode_id, ensure_writable)
        return await self._storage("load", steps.episode_id, lambda: store.load(steps.episode_id))

    async def forget(self, steps: EpisodeSteps) -> None:
        """The episode finished (or became restart-only): drop it and its stored record (live attempts only)."""
        self.untrack(steps)
        store = self.store
        if store is None:
            return
        if not steps.owns_checkpoint:
            log.warning("episode %s: a stale attempt leaves the checkpoint to the live one", steps.episode_id)
            return
        async with self._store_lock:
            await self._storage("delete", steps.episode_id, lambda: store.delete(steps.episode_id))

    async def _storage(self, operation: str, episode_id: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except OSError as exc:
            log.error("checkpoint store: %s of episode %s failed: %s", operation, episode_id, exc)
            if self._on_store_failure is not None:
                self._on_store_failure(operation)
            raise CheckpointStoreError(operation, episode_id, exc) from exc

    async def _run_export(self) -> CheckpointManifest:
        while True:
            self._changed.clear()
            busy = [p.episode_id for p in self._participants if p.busy]
            if not busy:
                break
            log.debug("checkpoint waits for %d busy episode(s): %s", len(busy), busy[:5])
            await self._changed.wait()
        checkpoint_id = uuid.uuid4().hex
        exported: dict[str, ExportedEpisode] = {}
        store = self.store
        assert store is not None
        async with self._store_lock:
            for p in sorted(self._participants, key=lambda p: p.episode_id):
                if p.finished or p.latest is None:
                    continue  # not started a step yet: a restore starts it over from its input
                if not p.owns_checkpoint:
                    continue  # an abandoned attempt never overwrites its successor's state
                record = CheckpointRecord(
                    episode_id=p.episode_id,
                    protocol=self.protocol,
                    input_digest=p.input_digest,
                    checkpoint_id=checkpoint_id,
                    steps_recorded=p.steps_recorded,
                    state=p.latest,
                )
                await self._storage("save", p.episode_id, functools.partial(store.save, record))
                exported[p.episode_id] = ExportedEpisode(next_step=p.latest.next_step, steps_recorded=p.steps_recorded)
        log.info("checkpoint %s exported %d episode(s)", checkpoint_id, len(exported))
        return CheckpointManifest(checkpoint_id=checkpoint_id, episodes=exported)
