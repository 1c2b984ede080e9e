"""Operator-level kopf handlers: settings at startup, and one set of credentials shared with our own client."""

from __future__ import annotations

import logging
from typing import Any

import kopf

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry)
    async def configure_kopf(settings: kopf.OperatorSettings, **_: Any) -> None:
        """Watch tuning and least privilege; the why of each line is in docs/operator.md ("Watches")."""
        settings.peering.standalone = True  # HA is a Lease (fleet_operator.leader), not kopf peering
        settings.scanning.disabled = True  # no CRD/namespace watching: fewer RBAC verbs, fixed resources
        settings.posting.level = logging.WARNING  # our Events are health transitions, not kopf chatter
        settings.watching.server_timeout = 270  # the API server ends each watch; kopf resumes it
        settings.watching.client_timeout = 300  # a silently dead connection is dropped and re-established
        settings.watching.connect_timeout = 10
        settings.watching.reconnect_backoff = 1.0
        settings.networking.request_timeout = 30
        settings.networking.error_backoffs = [1, 2, 4, 8, 15, 30, 30, 30, 30, 30]  # ride out ~3 min of API outage
        settings.process.ultimate_exiting_timeout = None  # the runner shuts down gracefully (flush, release Lease)

    @kopf.on.login(registry=registry)
    async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        """kopf's watches use exactly the credentials our writes use (loaded once by the runner)."""
        info: kopf.ConnectionInfo = memo.connection
        return info
