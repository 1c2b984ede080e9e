"""The operator's own HTTP endpoints: /healthz (liveness), /readyz (able to lead), /metrics (fleet_*).

Served by the runner on every replica, leader or standby: kopf's liveness endpoint exists only while kopf runs
(on the leader), and a standby that the kubelet killed for lacking one would never be there to take over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["RunnerState", "serve_http"]


@dataclass
class RunnerState:
    """What the endpoints report; the runner updates it."""

    role: Literal["starting", "standby", "leader", "stopping"] = "starting"
    failure: str | None = None
    """Set when a task the operator cannot live without died: liveness then fails and the kubelet restarts us."""
    synced: bool = False
    """Leading, primed and kopf started in this term."""
    can_lead: bool = False
    """This replica has primed and started kopf at least once (its rehearsal or a term): a standby is Ready only
    then, so a rolling update never removes the leader for a replica that would fail to take over."""
    identity: str = ""


@asynccontextmanager
async def serve_http(host: str, port: int, registry: CollectorRegistry, state: RunnerState) -> AsyncIterator[int]:
    """Serve the endpoints while the context is open; yields the bound port (useful with port 0)."""

    async def healthz(_: web.Request) -> web.Response:
        if state.failure is not None:
            return web.json_response({"status": "failed", "failure": state.failure}, status=500)
        return web.json_response({"status": "ok", "role": state.role})

    async def readyz(_: web.Request) -> web.Response:
        ready = state.failure is None and (
            (state.role == "standby" and state.can_lead) or (state.role == "leader" and state.synced)
        )
        return web.json_response(
            {"ready": ready, "role": state.role, "identity": state.identity}, status=200 if ready else 503
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        yield sockets[0].getsockname()[1] if sockets else port
    finally:
        await runner.cleanup()
