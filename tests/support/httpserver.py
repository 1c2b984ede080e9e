"""Small real aiohttp servers on 127.0.0.1 for tests: ``async with serve(app) as base_url``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serve(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve ``app`` on a kernel-chosen port of ``host`` (127.0.0.1, or ``::1``); yield its base URL; clean up."""
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def refused_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def blackhole() -> AsyncIterator[tuple[str, list[str]]]:
    """A target that accepts every request and never answers (until the context ends); yields (base URL, paths it
    was asked for)."""
    released = asyncio.Event()
    hits: list[str] = []

    async def swallow(request: web.Request) -> web.StreamResponse:
        hits.append(request.path)
        await released.wait()
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/{tail:.*}", swallow)
    try:
        async with serve(app) as url:
            yield url, hits
    finally:
        released.set()
