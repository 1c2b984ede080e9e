"""A minimal streaming OpenAI-compatible shard, run as its own process (``python stream_shard.py --port 0``).

The simulated shard does not stream; this one does, at a steady pace (one SSE chunk every ``--interval`` seconds:
the pace of token generation), so a test can freeze it (SIGSTOP) while a stream is in flight. It prints
``STREAM_SHARD_READY {"port": ...}`` once it listens; ``/admin/stats`` counts the generation requests it received
(``--fail-first N`` answers the first N with 503).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from aiohttp import web

READY_PREFIX = "STREAM_SHARD_READY "


def build_app(chunks: int, interval: float, fail_first: int = 0) -> web.Application:
    stats = {"generation_requests": 0, "errors_503": 0}

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def admin_stats(_: web.Request) -> web.Response:
        return web.json_response(stats)

    async def generate(request: web.Request) -> web.StreamResponse:
        stats["generation_requests"] += 1
        body = await request.json()
        if stats["generation_requests"] <= fail_first:
            stats["errors_503"] += 1
            return web.json_response({"error": {"message": "injected 503"}}, status=503)
        if not body.get("stream"):
            return web.json_response({"object": "text_completion", "choices": [{"index": 0, "text": "ok"}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(chunks):
            event = {"object": "text_completion", "choices": [{"index": 0, "text": f"t{index} "}]}
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await asyncio.sleep(interval)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/admin/stats", admin_stats)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    return app


async def main(port: int, chunks: int, interval: float, fail_first: int) -> None:
    runner = web.AppRunner(build_app(chunks, interval, fail_first), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    sys.stdout.write(READY_PREFIX + json.dumps({"port": bound, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--fail-first", type=int, default=0, help="Answer the first N generation requests 503.")
    options = parser.parse_args()
    asyncio.run(main(options.port, options.chunks, options.interval, options.fail_first))
