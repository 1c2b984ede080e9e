"""kopf handlers for GenerationShards: every watch event goes to the engine."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.handlers.common import apply_event
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(kinds.GROUP, kinds.VERSION, kinds.GENERATION_SHARD.plural, registry=registry)
    async def generation_shard_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        await apply_event(memo.engine, kinds.GENERATION_SHARD.kind, event)
