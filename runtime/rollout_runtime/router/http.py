"""The router's side towards its clients: aiohttp's low-level server (``web.Server``), one handler for every request.

aiohttp speaks HTTP/1.1 for the router: keep-alive, pipelined requests answered in order, chunked streams (an
HTTP/1.0 client gets its stream delimited by the close), writes that wait while a client's socket is full, a 400
and the close for bytes that are not HTTP/1.x or a head past its line and field limits, idle connections closed after
:data:`IDLE_SECONDS`. A handler is never cancelled because its client went away (the router's attempts end on their
own; a relayed stream stops at its next write). What is the router's own:

- :func:`read_body`: a body past ``max_body_bytes`` is not kept (the router answers 413 and the connection closes);
  ``Expect: 100-continue`` gets its ``100 Continue`` (or, for a declared length past the limit, that 413 at once);
- every answer to an HTTP/1.0 client closes its connection (:func:`open_stream` for a stream);
- :class:`AccessLogger`: one line per answer, never a body, a header or a query string.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractAccessLogger

__all__ = ["IDLE_SECONDS", "AccessLogger", "error_response", "json_response", "open_stream", "read_body", "serve"]

access_log = logging.getLogger("rollout_runtime.router.access")

IDLE_SECONDS: Final[float] = 75.0
"""An idle kept-alive client connection is closed after this long (aiohttp's and nginx's default keep-alive)."""
SHARD_HEADER: Final[str] = "X-Rollout-Shard"
"""The shard that produced the answer (the access log names it)."""
_CONTINUE: Final[bytes] = b"HTTP/1.1 100 Continue\r\n\r\n"


def json_response(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    headers = {"Content-Type": "application/json", **(headers or {})}
    return web.Response(status=status, body=json.dumps(payload).encode(), headers=headers)


def error_response(
    status: int, kind: str, message: str, headers: Mapping[str, str] | None = None, **extra: Any
) -> web.Response:
    """An OpenAI-shaped error: ``{"error": {"message", "type", "code", ...}}`` (what OpenAI clients raise from)."""
    return json_response({"error": {"message": message, "type": kind, "code": status, **extra}}, status, headers)


async def read_body(request: web.BaseRequest, limit: int) -> bytes | None:
    """The whole body, or None past ``limit`` bytes (declared or sent): then the connection closes after the
    answer, since the rest of the body is never read."""
    declared = request.content_length
    if declared is not None and declared > limit:
        return None
    if request.version >= HttpVersion11 and request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(_CONTINUE)  # what aiohttp's own expect handler sends
    content = request.content
    body = await content.read() if declared is not None else b""
    size = len(body)
    if declared is None:
        chunks = []
        while chunk := await content.readany():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        body = b"".join(chunks)
    return body


async def open_stream(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Send a streamed answer's head: chunked, or to an HTTP/1.0 client delimited by the close (aiohttp drops the
    chunking for HTTP/1.0 but would keep such a connection open, so the client would never see the end)."""
    if request.version < HttpVersion11:
        response.force_close()
    await response.prepare(request)


class AccessLogger(AbstractAccessLogger):
    """One line per answer, once it is written: client, method, path (no query string), status, duration, shard.
    Never a body or a header, so neither a prompt nor a credential reaches the log."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info(
            "%s %s %s %d %.1fms shard=%s",
            request.remote,
            request.method,
            request.path,
            response.status,
            time * 1000,
            response.headers.get(SHARD_HEADER, "-"),
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serve(handler: Handler, *, host: str, port: int, grace_seconds: float = 5.0) -> AsyncIterator[int]:
    """Serve ``handler`` on ``host:port`` (0: any free port) while the context is open; yields the bound port. On
    exit, answers in progress get ``grace_seconds`` to finish."""

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        response = await handler(request)
        if request.version < HttpVersion11 and not response.prepared:
            response.force_close()  # HTTP/1.0: its clients may read to the close
            response.headers["Connection"] = "close"
        return response

    server = web.Server(answer, access_log=access_log, access_log_class=AccessLogger, keepalive_timeout=IDLE_SECONDS)
    runner = web.ServerRunner(server, shutdown_timeout=grace_seconds)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()
