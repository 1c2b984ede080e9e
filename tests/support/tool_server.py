"""A sandbox tool server for environment tests: sees every step an environment applies, and can hold one.

The multi-step sim environment keeps its sandbox on it (``tool_url``), across every server process a test starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import defaultdict
from collections.abc import AsyncIterator

from aiohttp import web


class ToolServer:
    """A sandbox service: records every step applied, and can hold one step until the test releases it."""

    def __init__(self) -> None:
        self.applied: defaultdict[str, list[int]] = defaultdict(list)
        self.open_sandboxes: set[str] = set()
        self.closed: list[str] = []
        self._holds: dict[tuple[str, int], tuple[asyncio.Event, asyncio.Event]] = {}
        self._ids = itertools.count()
        self.url = ""

    def hold(self, episode_id: str, step: int) -> tuple[asyncio.Event, asyncio.Event]:
        """Hold the next call of this step once: returns (reached, release)."""
        events = (asyncio.Event(), asyncio.Event())
        self._holds[(episode_id, step)] = events
        return events

    async def open(self, request: web.Request) -> web.Response:
        body = await request.json()
        sandbox = f"{body['episode_id']}-sandbox-{next(self._ids)}"
        self.open_sandboxes.add(sandbox)
        return web.json_response({"sandbox_id": sandbox})

    async def step(self, request: web.Request) -> web.Response:
        body = await request.json()
        held = self._holds.pop((body["episode_id"], body["step"]), None)
        if held is not None:
            reached, release = held
            reached.set()
            await release.wait()
        self.applied[body["episode_id"]].append(body["step"])
        return web.json_response({"total": body["total"] + body["value"]})

    async def close(self, request: web.Request) -> web.Response:
        sandbox = (await request.json())["sandbox_id"]
        self.open_sandboxes.discard(sandbox)
        self.closed.append(sandbox)
        return web.json_response({"closed": sandbox})


def tool_app(server: ToolServer) -> web.Application:
    app = web.Application()
    app.router.add_post("/open", server.open)
    app.router.add_post("/step", server.step)
    app.router.add_post("/close", server.close)
    return app


@contextlib.asynccontextmanager
async def serve_tool_server() -> AsyncIterator[ToolServer]:
    """A ToolServer listening on 127.0.0.1 (its ``url`` set); held steps are released when the block ends."""
    server = ToolServer()
    runner = web.AppRunner(tool_app(server))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        for _, release in server._holds.values():
            release.set()
        await runner.cleanup()
