"""The router's HTTP/1.1 server: requests parsed by httptools, answers written straight to the connection.

The router's side towards its clients, as :mod:`rollout_runtime.router.client` is its side towards the shards.
aiohttp's server builds a request object, a URL, a header multidict, a response object and a per-connection task
loop for every request, and that Python work was most of what the router spent per relayed request
(docs/benchmarks.md); the router serves a handful of fixed routes and relays bytes, so this is all it needs:

- keep-alive as HTTP/1.1 has it (HTTP/1.0 and ``Connection: close`` close after the answer); requests on one
  connection are answered one at a time, in order (a pipelined request waits for the one before it);
- a body larger than ``max_body_bytes`` is not kept: the handler sees :attr:`Request.too_large` (the router answers
  413) and the connection closes after the answer. ``Expect: 100-continue`` gets its ``100 Continue`` (or, for a
  declared length past the limit, that answer at once);
- bytes that are not HTTP/1.x, or a head larger than :data:`MAX_HEAD_BYTES`: a 400 and the connection closes;
- an idle connection closes after :data:`IDLE_SECONDS` (one sweep for all of them, no timer per request);
- a streamed answer (:meth:`Request.open_stream`) is chunked; its writes wait while the client's socket is full,
  and raise :class:`ConnectionResetError` once the client has gone. A handler is never cancelled because its client
  went away (the router's attempts end on their own; a relayed stream stops at its next write).

Nothing here knows what a route means: a handler gets a :class:`Request` and returns a :class:`Response`, or the
:class:`Stream` it opened.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import http
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import httptools

__all__ = [
    "IDLE_SECONDS",
    "MAX_HEAD_BYTES",
    "AccessLog",
    "Handler",
    "Request",
    "Response",
    "Stream",
    "error_response",
    "json_response",
    "serve",
]

log = logging.getLogger("rollout_runtime.router.server")

MAX_HEAD_BYTES: Final[int] = 64 * 1024
"""A request line plus headers larger than this is refused (400): OpenAI clients send well under 1 KiB."""
IDLE_SECONDS: Final[float] = 75.0
"""An idle kept-alive connection is closed after this long (aiohttp's and nginx's default keep-alive)."""
_SWEEP_SECONDS: Final[float] = 5.0
_MAX_QUEUED: Final[int] = 16
"""Pipelined requests held per connection before reading pauses."""
_REASONS: Final[dict[int, bytes]] = {status.value: status.phrase.encode() for status in http.HTTPStatus}


@dataclass(eq=False, slots=True)
class Request:
    """One request, its body read in full (unless :attr:`too_large`)."""

    method: str
    path: str
    """Without the query string, which no route reads."""
    headers: Mapping[str, str]
    """Lower-cased names."""
    body: bytes
    remote: str
    too_large: bool = False
    """The body passed ``max_body_bytes`` and was dropped (``body`` is empty)."""
    stream: Stream | None = None
    """The streamed answer, once :meth:`open_stream` opened it."""
    _connection: _Connection | None = field(default=None, repr=False)

    def open_stream(self, status: int, headers: Mapping[str, str]) -> Stream:
        """Send the answer's head now, chunked; the body follows with :meth:`Stream.write`. Raises
        :class:`ConnectionResetError` if the client has gone."""
        connection = self._connection
        assert connection is not None, "a request made by the server"
        assert self.stream is None, "a request is answered once"
        self.stream = Stream(connection, status, headers)
        return self.stream


@dataclass(frozen=True, slots=True)
class Response:
    """A complete answer."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Content-Length is added; Content-Type is the caller's (JSON by default)."""


def json_response(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})})


def error_response(
    status: int, kind: str, message: str, headers: Mapping[str, str] | None = None, **extra: Any
) -> Response:
    """An OpenAI-shaped error: ``{"error": {"message", "type", "code", ...}}`` (what OpenAI clients raise from)."""
    return json_response({"error": {"message": message, "type": kind, "code": status, **extra}}, status, headers)


Handler = Callable[[Request], Awaitable["Response | Stream"]]
AccessLog = Callable[[Request, int, float, Mapping[str, str]], None]
"""Called once per answer: the request, the status sent, seconds from the request's end to the answer's, and the
answer's headers."""


def _head(status: int, headers: Mapping[str, str], framing: bytes) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
    for name, value in headers.items():
        if "\r" in value or "\n" in value:  # a relayed value can never split the head
            raise ValueError(f"header {name!r} has a line break")
        lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
    lines.append(framing)
    return b"".join(lines)


class Stream:
    """A streamed answer being written: chunked (to an HTTP/1.0 client, delimited by the close instead); :meth:`end`
    finishes it."""

    def __init__(self, connection: _Connection, status: int, headers: Mapping[str, str]) -> None:
        self._connection = connection
        self.status = status
        self.headers = headers
        self.ended = False
        self._chunked = connection.http11
        if not self._chunked:
            connection.close_after()
        framing = b"Transfer-Encoding: chunked\r\n\r\n" if self._chunked else b"Connection: close\r\n\r\n"
        connection.write(_head(status, headers, framing))

    async def write(self, data: bytes) -> None:
        if not data:
            return
        self._connection.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        await self._connection.drain()

    async def end(self) -> None:
        """The last chunk; the connection then serves its next request (or closes)."""
        if not self.ended:
            self.ended = True
            if self._chunked:
                self._connection.write(b"0\r\n\r\n")
            await self._connection.drain()


class _Connection(asyncio.Protocol):
    """One client connection: parses its requests and runs the handler for each, one at a time."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._loop = server.loop
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._remote = "-"
        self._queue: collections.deque[Request] = collections.deque()
        self._busy = False
        self._close_after = False
        self._reading_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._writable = True
        self._discard = False
        """Stop reading: what the client sends next is not a request this connection will answer."""
        self.http11 = True
        self.idle_since = self._loop.time()
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._too_large = False

    # -- asyncio.Protocol ----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's does not subclass asyncio.Transport
        peer = transport.get_extra_info("peername")
        self._remote = str(peer[0]) if isinstance(peer, tuple) and peer else "-"
        self._server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._discard:
            return
        self.idle_since = self._loop.time()  # an upload in progress is not idle
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse_protocol("protocol upgrades are not served")
        except httptools.HttpParserError as exc:  # a callback's exception arrives as its context
            cause = exc.__context__ if isinstance(exc.__context__, _HeadTooLarge) else exc
            self._refuse_protocol(f"not an HTTP/1.x request the router serves: {cause}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._server.connections.discard(self)
        self._queue.clear()
        self._wake_writer()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        self._wake_writer()

    # -- httptools callbacks -------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        declared = self._headers.get("content-length")
        limit = self._server.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            self._too_large = True
        self.http11 = self._parser.get_http_version() == "1.1"
        if self.http11 and self._headers.get("expect", "").lower() == "100-continue":
            if self._too_large:  # the client waits for a go-ahead: answer now, and never read the body
                self._enqueue()
                self._discard = True
                return
            self._send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._server.max_body_bytes:
            self._too_large = True
            self._body.clear()
        elif not self._too_large:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if not self._discard:  # else: answered at its headers
            self._enqueue()

    # -- serving -------------------------------------------------------------------------------------------------

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge(f"the request's head exceeds {MAX_HEAD_BYTES} bytes")

    def _enqueue(self) -> None:
        parser = self._parser
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        request = Request(
            parser.get_method().decode("ascii"),
            path,
            self._headers,
            b"" if self._too_large else b"".join(self._body),
            self._remote,
            too_large=self._too_large,
            _connection=self,
        )
        if self._too_large or not self.http11 or not parser.should_keep_alive():
            self._close_after = True  # HTTP/1.0 even with keep-alive asked for: its clients may read to the close
        self._queue.append(request)
        if len(self._queue) >= _MAX_QUEUED and self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        if not self._busy:
            self._busy = True
            self._server.spawn(self._serve())

    async def _serve(self) -> None:
        """Answer queued requests in order until none is left (the task ends; the next request starts another)."""
        try:
            while self._queue and self.transport is not None:
                request = self._queue.popleft()
                if self._reading_paused and len(self._queue) < _MAX_QUEUED // 2:
                    self._reading_paused = False
                    self.transport.resume_reading()
                await self._answer(request)
                if self._close_after and not self._queue:
                    self.close()
        finally:
            self._busy = False
            self.idle_since = self._loop.time()

    async def _answer(self, request: Request) -> None:
        started = self._loop.time()
        try:
            answer = await self._server.handler(request)
        except Exception:
            log.exception("the router's handler failed on %s %s", request.method, request.path)
            answer = _internal_error()
        status, headers = answer.status, answer.headers
        try:
            if isinstance(answer, Stream):
                await answer.end()
            else:
                last = self._close_after and not self._queue
                framing = b"Content-Length: %d\r\n%s\r\n" % (len(answer.body), b"Connection: close\r\n" * last)
                try:
                    head = _head(status, headers, framing)
                except ValueError:
                    log.exception("the router's answer to %s %s has an invalid header", request.method, request.path)
                    answer = _internal_error()
                    status, headers = answer.status, answer.headers
                    head = _head(status, headers, framing)
                self.write(head + answer.body)
        except ConnectionError:
            status = 499  # the client went away before the answer was complete
        access = self._server.access_log
        if access is not None:
            access(request, status, self._loop.time() - started, headers)

    def _refuse_protocol(self, reason: str) -> None:
        self._discard = True
        self._queue.clear()
        if self._busy:  # an answer is being written: let it finish, then close
            self._close_after = True
            return
        refusal = error_response(400, "invalid_request_error", reason)
        framing = b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(refusal.body)
        self._send(_head(refusal.status, refusal.headers, framing) + refusal.body)
        self.close()

    def _send(self, data: bytes) -> None:
        """Write if the client is still there (the protocol's own answers, which nobody waits on)."""
        with contextlib.suppress(ConnectionError):
            self.write(data)

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        transport.write(data)

    async def drain(self) -> None:
        """Until the client's socket takes more (at once unless the transport paused us)."""
        if self._writable:
            return
        if self.transport is None:
            raise ConnectionResetError("the client closed the connection")
        self._drain = self._loop.create_future()
        try:
            await self._drain
        finally:
            self._drain = None
        if self.transport is None:
            raise ConnectionResetError("the client closed the connection")

    def _wake_writer(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def close_after(self) -> None:
        """Close once the answer in progress is complete."""
        self._close_after = True

    @property
    def idle(self) -> bool:
        return not self._busy


class _HeadTooLarge(Exception):
    pass


def _internal_error() -> Response:
    return error_response(500, "router_error", "internal error")


class _Server:
    """The listening socket's connections and the tasks answering them."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, access_log: AccessLog | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.access_log = access_log
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.TimerHandle | None = self.loop.call_later(_SWEEP_SECONDS, self._sweep)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _sweep(self) -> None:
        oldest = self.loop.time() - IDLE_SECONDS
        for connection in [c for c in self.connections if c.idle and c.idle_since < oldest]:
            connection.close()
        self._sweeper = self.loop.call_later(_SWEEP_SECONDS, self._sweep)

    async def shutdown(self, grace_seconds: float) -> None:
        """Close idle connections, let answers in progress finish within ``grace_seconds``, then close the rest."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in [c for c in self.connections if c.idle]:
            connection.close()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=grace_seconds)
        for task in set(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks))
        for connection in set(self.connections):
            connection.close()


@contextlib.asynccontextmanager
async def serve(
    handler: Handler,
    *,
    host: str,
    port: int,
    max_body_bytes: int,
    access_log: AccessLog | None = None,
    grace_seconds: float = 5.0,
) -> AsyncIterator[int]:
    """Serve ``handler`` on ``host:port`` (0: any free port) while the context is open; yields the bound port."""
    server = _Server(handler, max_body_bytes=max_body_bytes, access_log=access_log)
    listening = await server.loop.create_server(lambda: _Connection(server), host, port)
    try:
        yield int(listening.sockets[0].getsockname()[1])
    finally:
        listening.close()
        await server.shutdown(grace_seconds)
        await listening.wait_closed()
