"""kopf handlers for PolicyVersions (the trainer's policy version and refits): an upsert or delete of a fleet's
PolicyVersion, for each watch event."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.handlers.common import apply
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(kinds.GROUP, kinds.VERSION, kinds.POLICY_VERSION.plural, registry=registry)
    async def policy_version_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        await apply(event, upsert=memo.engine.upsert_policy_version, delete=memo.engine.delete_policy_version)
