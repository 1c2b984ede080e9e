"""What every kind's handler does with a watch event: an upsert for a listed, added or modified object, a delete for
a deleted one (kopf re-lists after 410 Gone: upserts are idempotent)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from rollout_runtime.kube import kinds

__all__ = ["Delete", "Upsert", "apply", "register_target"]

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


def register_target(registry: kopf.OperatorRegistry, target: kinds.KindNames) -> None:
    """The handler of a kind whose objects are probe targets (GenerationShard, EnvironmentServer): the engine's
    ``upsert_target`` / ``delete_target`` for that kind."""

    @kopf.on.event(kinds.GROUP, kinds.VERSION, target.plural, registry=registry, id=f"{target.singular}_event")
    async def target_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        await apply(
            event,
            upsert=functools.partial(memo.engine.upsert_target, target.kind),
            delete=functools.partial(memo.engine.delete_target, target.kind),
        )
