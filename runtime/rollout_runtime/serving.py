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

__all__ = ["exposition", "scrape", "serve_app"]


def scrape(registry: CollectorRegistry) -> tuple[bytes, str]:
    """``registry`` in Prometheus' text format, and its Content-Type: the body of every answer to a scrape."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


def exposition(registry: CollectorRegistry) -> web.Response:
    """:func:`scrape` as an aiohttp response."""
    body, content_type = scrape(registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
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
