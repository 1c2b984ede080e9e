"""kopf handlers for EnvironmentServers: every watch event goes to the engine."""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.decisions import ENVIRONMENT_SERVER
from fleet_operator.handlers.common import apply_event
from fleet_operator.models import GROUP, VERSION

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(GROUP, VERSION, "environmentservers", registry=registry)
    async def environment_server_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        await apply_event(memo.engine, ENVIRONMENT_SERVER, event)
