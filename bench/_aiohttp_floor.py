"""The floor under ``rollout-fleet router``: the least an aiohttp proxy can do, for bench/router_overhead.py.

One aiohttp server, one aiohttp client session, shards taken round-robin, the body read and parsed as JSON (the
router must parse it for ``stream`` and ``user``), the answer relayed whole. No selection, retries, ejection,
metrics or access log: what this costs above nginx is an aiohttp server and aiohttp's client in Python. The router
is built on the same two (its low-level server), so what it costs above this floor is its own work per request.

    python bench/_aiohttp_floor.py http://127.0.0.1:8001 http://127.0.0.1:8002   # prints "FLOOR_READY <port>"
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from typing import Final

import aiohttp
from aiohttp import web

READY: Final[str] = "FLOOR_READY"


async def serve(shards: list[str]) -> None:
    targets = itertools.cycle(shards)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=120)
    connector = aiohttp.TCPConnector(limit=1024)
    async with aiohttp.ClientSession(connector=connector, trust_env=False, auto_decompress=False) as session:

        async def relay(request: web.Request) -> web.Response:
            body = await request.read()
            json.loads(body)
            url = next(targets) + request.path
            headers = {"Content-Type": "application/json"}
            async with session.post(url, data=body, headers=headers, timeout=timeout) as answer:
                data = await answer.read()
                kind = answer.headers.get("Content-Type", "application/json")
                return web.Response(status=answer.status, body=data, headers={"Content-Type": kind})

        app = web.Application()
        app.router.add_post("/v1/completions", relay)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        print(READY, runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()  # until the benchmark kills it


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1:]))
