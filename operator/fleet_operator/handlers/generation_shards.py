"""kopf handlers for GenerationShards: each watch event is an upsert or a delete of a target."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.engine import FleetEngine
from fleet_operator.handlers.common import watched
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    shard = kinds.GENERATION_SHARD

    @kopf.on.event(kinds.GROUP, kinds.VERSION, shard.plural, registry=registry)
    async def generation_shard_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        engine: FleetEngine = memo.engine
        seen = watched(event)
        if seen.deleted:
            await engine.delete_target(shard.kind, seen.namespace, seen.name)
        else:
            await engine.upsert_target(shard.kind, seen.body)
