"""kopf handlers for RolloutFleets: each watch event is an upsert or a delete of a fleet."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.engine import FleetEngine
from fleet_operator.handlers.common import watched
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(kinds.GROUP, kinds.VERSION, kinds.ROLLOUT_FLEET.plural, registry=registry)
    async def rollout_fleet_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        engine: FleetEngine = memo.engine
        seen = watched(event)
        if seen.deleted:
            await engine.delete_fleet(seen.namespace, seen.name)
        else:
            await engine.upsert_fleet(seen.body)
