"""Where exported checkpoints live: a store interface and its durable filesystem default.

A checkpoint that is half-written, bit-flipped or from another format must never be loaded as truth: the episode
would continue from a state it never reached. The filesystem store therefore writes atomically (temporary file,
fsync, rename, fsync of the directory) and wraps every payload in an envelope with a SHA-256 checksum; loading a
file that fails any check raises :class:`CorruptCheckpointError`, naming the file and what is wrong with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

from pydantic import ValidationError

from rollout_runtime.environment.checkpoint.state import EPISODE_ID_PATTERN, CheckpointRecord

__all__ = [
    "CheckpointStore",
    "CheckpointStoreError",
    "CorruptCheckpointError",
    "FilesystemCheckpointStore",
    "MemoryCheckpointStore",
]

FORMAT: Final[str] = "rollout-fleet/episode-checkpoint"
VERSION: Final[int] = 1
_SUFFIX: Final[str] = ".checkpoint.json"
_TMP_SUFFIX: Final[str] = ".tmp"
_EPISODE_ID: Final[re.Pattern[str]] = re.compile(EPISODE_ID_PATTERN)


class CorruptCheckpointError(Exception):
    """A stored checkpoint failed validation (torn, truncated, altered or foreign); it was not loaded."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(
            f"checkpoint file {path} is corrupt ({problem}); it was not loaded. "
            "Move it aside to start this episode over from its input."
        )
        self.path = str(path)
        self.problem = problem


class CheckpointStoreError(OSError):
    """The store's storage failed (an ``OSError``: a read-only directory, a path that is a directory, a full disk).

    An infrastructure failure, not the episode's: another attempt, on a server with working storage, may succeed.
    Still an ``OSError`` (with the original ``errno``), so code that caught the store's own errors keeps working.
    """

    def __init__(self, operation: str, episode_id: str, error: OSError) -> None:
        super().__init__(
            f"the checkpoint store could not {operation} episode {episode_id!r}: {type(error).__name__}: {error}"
        )
        self.errno = error.errno
        self.operation = operation
        self.episode_id = episode_id


@runtime_checkable
class CheckpointStore(Protocol):
    """Durable home of exported episodes, keyed by episode id."""

    async def save(self, record: CheckpointRecord) -> None:
        """Replace the episode's record; when this returns, the record survives a crash."""

    async def load(self, episode_id: str) -> CheckpointRecord | None:
        """The episode's record, None if there is none; :class:`CorruptCheckpointError` if it is damaged."""

    async def delete(self, episode_id: str) -> None:
        """Forget the episode (it finished); missing is fine."""


class MemoryCheckpointStore:
    """A process-local store: for tests, and for servers that only park (nothing survives a crash)."""

    def __init__(self) -> None:
        self.records: dict[str, CheckpointRecord] = {}

    async def save(self, record: CheckpointRecord) -> None:
        self.records[record.episode_id] = record

    async def load(self, episode_id: str) -> CheckpointRecord | None:
        return self.records.get(episode_id)

    async def delete(self, episode_id: str) -> None:
        self.records.pop(episode_id, None)


class FilesystemCheckpointStore:
    """One file per episode in ``directory``; atomic and durable writes, verified reads.

    Leftover temporary files (a crash between write and rename) are removed when the store opens: the previous
    complete file, if any, is still in place.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(f".*{_TMP_SUFFIX}"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()

    def path_for(self, episode_id: str) -> Path:
        if not _EPISODE_ID.fullmatch(episode_id):
            raise ValueError(f"episode id {episode_id!r} is not a safe file name ({EPISODE_ID_PATTERN})")
        return self.directory / f"{episode_id}{_SUFFIX}"

    async def save(self, record: CheckpointRecord) -> None:
        await asyncio.to_thread(self._save, record)

    async def load(self, episode_id: str) -> CheckpointRecord | None:
        return await asyncio.to_thread(self._load, episode_id)

    async def delete(self, episode_id: str) -> None:
        await asyncio.to_thread(self._delete, episode_id)

    async def ensure_writable(self) -> None:
        """Raise ``OSError`` unless records can be replaced and dropped here (checked before an episode starts).

        An attempt that cannot drop its checkpoint when it finishes would leave a finished episode to be continued.
        Stores without this method are assumed writable.
        """
        await asyncio.to_thread(self._ensure_writable)

    def _ensure_writable(self) -> None:
        if not self.directory.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "the checkpoint directory is missing", str(self.directory))
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "the checkpoint directory is not writable", str(self.directory))

    def _save(self, record: CheckpointRecord) -> None:
        path = self.path_for(record.episode_id)
        payload = record.model_dump(mode="json")
        envelope = {"format": FORMAT, "version": VERSION, "sha256": _checksum(payload), "payload": payload}
        data = json.dumps(envelope, sort_keys=True).encode()
        tmp = self.directory / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}{_TMP_SUFFIX}"
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        self._fsync_directory()

    def _load(self, episode_id: str) -> CheckpointRecord | None:
        path = self.path_for(episode_id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        envelope = _parse_envelope(path, raw)
        payload = envelope["payload"]
        if envelope.get("sha256") != _checksum(payload):
            raise CorruptCheckpointError(path, "checksum mismatch: the payload was altered or partly written")
        try:
            record = CheckpointRecord.model_validate(payload)
        except ValidationError as exc:
            raise CorruptCheckpointError(
                path, f"payload does not match the checkpoint schema: {exc.error_count()} error(s)"
            ) from None
        if record.episode_id != episode_id:
            raise CorruptCheckpointError(path, f"it belongs to episode {record.episode_id!r}, not {episode_id!r}")
        return record

    def _delete(self, episode_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path_for(episode_id).unlink()
            self._fsync_directory()

    def _fsync_directory(self) -> None:
        """Make the rename itself durable: without it a crash can bring back the old directory entry."""
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _parse_envelope(path: Path, raw: bytes) -> dict[str, Any]:
    if not raw:
        raise CorruptCheckpointError(path, "the file is empty")
    try:
        envelope = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(path, f"not valid JSON, likely torn or truncated: {exc}") from None
    if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
        raise CorruptCheckpointError(path, f"not a {FORMAT} file")
    if envelope.get("version") != VERSION:
        raise CorruptCheckpointError(path, f"unsupported version {envelope.get('version')!r} (expected {VERSION})")
    if not isinstance(envelope.get("payload"), dict):
        raise CorruptCheckpointError(path, "the payload is missing")
    return envelope


def _checksum(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
