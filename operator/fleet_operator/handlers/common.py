"""What every kind's handler does with a watch event: an upsert for a listed, added or modified object, a delete for
a deleted one (kopf re-lists after 410 Gone: upserts are idempotent)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

__all__ = ["Delete", "Upsert", "apply"]

Upsert = Callable[[Mapping[str, Any]], Awaitable[None]]
"""The engine's method taking the object (``FleetEngine.upsert_fleet``...)."""
Delete = Callable[[str, str], Awaitable[None]]
"""The engine's method taking the deleted object's namespace and name (``FleetEngine.delete_fleet``...)."""


async def apply(event: kopf.RawEvent, *, upsert: Upsert, delete: Delete) -> None:
    """Call ``delete(namespace, name)`` for a DELETED event, ``upsert(object)`` for any other."""
    body: dict[str, Any] = dict(event.get("object") or {})
    if event.get("type") == "DELETED":
        meta = body.get("metadata") or {}
        await delete(meta.get("namespace", ""), meta.get("name", ""))
    else:
        await upsert(body)
