"""kopf handlers for PolicyVersions (the trainer's policy version and refits): each watch event is an upsert or a
deletion of a fleet's PolicyVersion."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.engine import FleetEngine
from fleet_operator.handlers.common import watched
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(kinds.GROUP, kinds.VERSION, kinds.POLICY_VERSION.plural, registry=registry)
    async def policy_version_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        engine: FleetEngine = memo.engine
        seen = watched(event)
        if seen.deleted:
            engine.forget_policy_version(seen.namespace, seen.name)
        else:
            await engine.upsert_policy_version(seen.body)
