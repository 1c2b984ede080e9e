"""Serving an aiohttp application on the running loop, and the one Prometheus exposition response.

Both the runtime's ``/metrics`` server and ``rollout-fleet router`` bind a port (0: any free one), report the port
the kernel chose, and clean up on the way out; both answer a scrape the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["exposition", "serve_app"]


def exposition(registry: CollectorRegistry) -> web.Response:
    """``registry`` in Prometheus' text format, as a response to a scrape."""
    response = web.Response(body=generate_latest(registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


@asynccontextmanager
async def serve_app(app: web.Application, *, host: str, port: int, **runner: Any) -> AsyncIterator[int]:
    """Serve ``app`` on ``host:port`` while the context is open; yield the bound port. ``runner``: AppRunner options
    (the access log)."""
    app_runner = web.AppRunner(app, **runner)
    await app_runner.setup()
    try:
        site = web.TCPSite(app_runner, host, port)
        await site.start()
        bound = app_runner.addresses[0][1] if app_runner.addresses else port
        yield int(bound)
    finally:
        await app_runner.cleanup()
