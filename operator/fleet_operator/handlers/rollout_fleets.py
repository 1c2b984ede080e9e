"""kopf handlers for RolloutFleets: every watch event goes to the engine."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.engine import ROLLOUT_FLEET
from fleet_operator.handlers.common import apply_event
from fleet_operator.models import GROUP, VERSION

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(GROUP, VERSION, "rolloutfleets", registry=registry)
    async def rollout_fleet_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        await apply_event(memo.engine, ROLLOUT_FLEET, event)
