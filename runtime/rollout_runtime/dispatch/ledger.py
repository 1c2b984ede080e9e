"""The failure ledger: one JSON line per prompt the run could not complete, with the reason.

Data failures must be loud and inspectable after the fact (which prompts, why, on which shards), never a
silent zero-reward sample. A line is written and flushed per failure: failures are rare, and a ledger that
loses its tail in a crash is the one you needed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Literal

__all__ = ["FailureLedger", "LedgerEntry", "QuarantineEntry"]

_PREVIEW_CHARS = 200
"""Enough of a prompt to recognise it in the ledger, bounded so the ledger's size does not grow with prompt length."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One prompt that ended without a result."""

    prompt_id: str | int
    result: Literal["data_failed", "skipped"]
    failure_class: str
    failure_type: str
    reason: str
    attempts: int
    shards: tuple[str, ...]
    time: float
    """Wall-clock (unix) time the prompt was given up."""
    prompt_preview: str = ""
    stale_by_version: dict[str, int] = field(default_factory=dict)
    """The prompt's answers not committed because of their weights, by the version they came from (``"unknown"``:
    a restarted or refitting shard's): a prompt skipped after only stale answers shows which policies answered."""

    def to_json(self) -> str:
        record = asdict(self)
        record["shards"] = list(self.shards)
        return json.dumps(record, ensure_ascii=False, default=str)


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    """A shard quarantined for its outputs (``result: "quarantined"``): the evidence, and the prompts of its recent
    window, so the run's record says which results came from a shard found wrong while it answered 200."""

    shard: str
    signal: str
    test: str
    weights_version: int | None
    p_value: float
    threshold: float
    effect: float
    evidence: dict[str, float]
    peers: tuple[str, ...]
    prompt_ids: tuple[str | int, ...]
    time: float
    result: Literal["quarantined"] = "quarantined"

    def to_json(self) -> str:
        record = asdict(self)
        record["peers"], record["prompt_ids"] = list(self.peers), list(self.prompt_ids)
        return json.dumps(record, ensure_ascii=False, default=str)


def preview(prompt: object) -> str:
    """A bounded, printable rendering of a prompt for humans reading the ledger."""
    try:
        text = prompt if isinstance(prompt, str) else repr(prompt)
    except Exception:
        text = f"<unprintable {type(prompt).__name__}>"
    return text if len(text) <= _PREVIEW_CHARS else text[: _PREVIEW_CHARS - 3] + "..."


def stale_by_version(counts: Mapping[int | None, int]) -> dict[str, int]:
    """Stale-answer counts by weights version as JSON keys, in version order (``"unknown"`` last)."""
    known = sorted((version, n) for version, n in counts.items() if version is not None)
    out = {str(version): n for version, n in known}
    if None in counts:
        out["unknown"] = counts[None]
    return out


class FailureLedger:
    """Appends :class:`LedgerEntry` lines to ``path`` (created with its directory on first write)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None

    def write(self, entry: LedgerEntry | QuarantineEntry) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(entry.to_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @staticmethod
    def read(path: str | os.PathLike[str]) -> list[dict[str, object]]:
        """Every entry in a ledger file, as dicts (for reports and tests)."""
        with Path(path).open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
