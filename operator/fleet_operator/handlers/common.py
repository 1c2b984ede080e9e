"""What every kind's handler reads of a watch event: the object, where it is, and whether it was deleted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import kopf

__all__ = ["Watched", "watched"]


@dataclass(frozen=True)
class Watched:
    """One watch event's object. Listed, added and modified are upserts (kopf re-lists after 410 Gone: upserts are
    idempotent); deleted is a delete."""

    body: dict[str, Any]
    namespace: str
    name: str
    deleted: bool


def watched(event: kopf.RawEvent) -> Watched:
    """The event's object, namespace and name (empty when absent), and whether it is a deletion. Pure."""
    body: dict[str, Any] = dict(event.get("object") or {})
    meta = body.get("metadata") or {}
    return Watched(body, meta.get("namespace", ""), meta.get("name", ""), event.get("type") == "DELETED")
