"""kopf handlers for GenerationShards: a target's upsert or delete, for each watch event."""

from __future__ import annotations

import functools
from typing import Any

import kopf

from fleet_operator.engine import FleetEngine
from fleet_operator.handlers.common import apply
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    shard = kinds.GENERATION_SHARD.kind

    @kopf.on.event(kinds.GROUP, kinds.VERSION, kinds.GENERATION_SHARD.plural, registry=registry)
    async def generation_shard_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        engine: FleetEngine = memo.engine
        await apply(
            event,
            upsert=functools.partial(engine.upsert_target, shard),
            delete=functools.partial(engine.delete_target, shard),
        )
