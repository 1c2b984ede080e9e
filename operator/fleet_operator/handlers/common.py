"""The one thing every kind's handler does: pass a watch event to the engine."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.engine import FleetEngine

__all__ = ["apply_event"]


async def apply_event(engine: FleetEngine, kind: str, event: kopf.RawEvent) -> None:
    """Listed/added/modified -> upsert; deleted -> delete. (kopf re-lists after 410 Gone: upserts are idempotent.)"""
    body: dict[str, Any] = dict(event.get("object") or {})
    meta = body.get("metadata") or {}
    if event.get("type") == "DELETED":
        await engine.delete(kind, meta.get("namespace", ""), meta.get("name", ""))
    else:
        await engine.upsert(kind, body)
