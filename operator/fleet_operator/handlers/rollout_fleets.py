"""kopf handlers for RolloutFleets: a fleet's upsert or delete, for each watch event."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.handlers.common import apply
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(kinds.GROUP, kinds.VERSION, kinds.ROLLOUT_FLEET.plural, registry=registry)
    async def rollout_fleet_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        await apply(event, upsert=memo.engine.upsert_fleet, delete=memo.engine.delete_fleet)
