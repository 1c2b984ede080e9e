"""kopf handlers for EnvironmentServers: each watch event is an upsert or a delete of a target."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.engine import FleetEngine
from fleet_operator.handlers.common import watched
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    server = kinds.ENVIRONMENT_SERVER

    @kopf.on.event(kinds.GROUP, kinds.VERSION, server.plural, registry=registry)
    async def environment_server_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        engine: FleetEngine = memo.engine
        seen = watched(event)
        if seen.deleted:
            await engine.delete_target(server.kind, seen.namespace, seen.name)
        else:
            await engine.upsert_target(server.kind, seen.body)
