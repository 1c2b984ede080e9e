"""The router's HTTP/1.1 client to its shards: kept-alive connections per shard, replies parsed by httptools.

The rest of the router speaks aiohttp; its side towards the shards does not. aiohttp's client is a general one (a
request and a response object, cookie jar, trace hooks, redirect and timeout machinery for every request) and it
costs several times what a pooled connection fed to a parser does, on every request the router relays
(docs/benchmarks.md). The router only sends a JSON POST or a GET to a shard it knows and relays the bytes, so this is
all it needs:

- one idle list per shard address. A connection goes back only once its reply was read to the end, the shard
  allowed keep-alive and the reply was final (2xx-5xx); it is reused only within :data:`KEEPALIVE_SECONDS`;
  anything else is closed;
- the read timeout is the longest silence (before the reply's first byte, or between two), not a deadline: a stream
  may last as long as its shard keeps talking;
- failures are the exceptions the taxonomy knows: :class:`ConnectionError` (refused, reset, closed mid-reply),
  :class:`TimeoutError` (connect or read), :class:`OSError` (no route, no such host), and
  :class:`InvalidResponse` (not HTTP/1.x, or headers past :data:`MAX_HEADER_BYTES`);
- a reply's unread bytes stop the reading from the shard past a high-water mark (TCP backpressure, not memory).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ssl
from dataclasses import dataclass
from types import TracebackType
from typing import Final, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = ["KEEPALIVE_SECONDS", "MAX_HEADER_BYTES", "InvalidResponse", "Reply", "ShardClient"]

KEEPALIVE_SECONDS: Final[float] = 4.0
"""An idle connection older than this is closed, not reused: under the 5 s after which uvicorn (vLLM) and
cpp-httplib (llama.cpp) close idle connections, so the router never sends a request into one the shard is closing."""
MAX_HEADER_BYTES: Final[int] = 64 * 1024
"""A reply whose header block is larger is invalid (a shard sends a few hundred bytes)."""
_HIGH_WATER: Final[int] = 256 * 1024
_MAX_IDLE_PER_SHARD: Final[int] = 256


class InvalidResponse(Exception):
    """The shard's bytes are not an HTTP/1.x reply the router can relay."""


@dataclass(frozen=True, slots=True)
class _Address:
    """Where connections go (the idle lists' key)."""

    host: str
    port: int
    tls: bool


@dataclass(frozen=True, slots=True)
class _Endpoint:
    address: _Address
    authority: bytes
    """The Host header."""
    base: bytes
    """The endpoint's own path, prefixed to every request's."""


@functools.lru_cache(maxsize=1024)
def _endpoint(endpoint: str) -> _Endpoint:
    url = URL(endpoint)
    if url.scheme not in ("http", "https") or not url.raw_host or url.port is None:
        raise ValueError(f"not an http(s) URL with a host: {endpoint!r}")
    return _Endpoint(
        _Address(url.raw_host, url.port, url.scheme == "https"),
        authority=(url.host_port_subcomponent or "").encode("ascii"),
        base=url.raw_path.rstrip("/").encode("ascii"),
    )


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class _Connection(asyncio.Protocol):
    """One TCP connection to a shard and the reply being read on it (one at a time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, address: _Address, read_timeout: float) -> None:
        self._loop = loop
        self.address = address
        self._read_timeout = read_timeout
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.in_use = False
        """Whether a request was sent and its reply is still being read."""
        self._start()

    def _start(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.delimited = False
        """Whether the reply says where its body ends (Content-Length or chunked); if not, the close does."""
        self.content_length: int | None = None
        self.content_type: str | None = None
        self.error: BaseException | None = None
        self.answered = False
        """Whether any byte of the reply arrived."""
        self.chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._heard = 0.0

    # -- asyncio.Protocol ----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's does not subclass asyncio.Transport, so no isinstance check.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.in_use:  # bytes nobody asked for (a second reply?): the connection can never be trusted again
            self.close()
            return
        self._heard = self._loop.time()
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(InvalidResponse("the shard switched protocols"))
        except httptools.HttpParserError as exc:
            if self.error is None and not self.complete:
                self._fail(InvalidResponse(f"not an HTTP/1.x reply: {exc}"))
            self.close()  # a complete reply still stands; its connection does not

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.complete or self.error is not None:
            return
        if self.headers_done and not self.delimited and exc is None:
            self.complete = True  # a body that ends where the connection does (HTTP/1.0 style)
            self._wake()
            return
        where = "mid-reply" if self.headers_done else "before its reply"
        self._fail(ConnectionResetError(f"the shard closed the connection {where}"))

    # -- httptools callbacks -------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.headers_done:  # a second reply to one request: stop here, never read it as the next one's
            raise InvalidResponse("a second reply to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > MAX_HEADER_BYTES:
            self.error = InvalidResponse(f"the reply's headers exceed {MAX_HEADER_BYTES} bytes")
            self._wake()
            raise self.error
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        for name, value in self.raw_headers:
            lowered = name.lower()
            if lowered == b"content-length":
                self.delimited = True
                self.content_length = int(value) if value.isdigit() else None
            elif lowered == b"content-type":
                self.content_type = value.decode("latin-1")
            elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
                self.delimited = True
        if self.status in (204, 304) or self.status < 200:
            self.delimited = True
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()  # only here: the parser forgets it for the next message
        self.complete = True
        self._wake()

    # -- the reply's side ----------------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self._start()
        self.in_use = True
        self.transport.write(data)
        self._heard = self._loop.time()
        self._timer = self._loop.call_at(self._heard + self._read_timeout, self._check_silence)

    async def wait(self) -> None:
        """Until something arrives (headers, bytes, the end) or the reply failed; raises its failure."""
        if self.error is not None:
            raise self.error
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    async def next_chunk(self) -> bytes:
        """The reply's next body bytes; ``b""`` once it ended."""
        while not self.chunks:
            if self.complete:
                return b""
            await self.wait()
        chunk = self.chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < _HIGH_WATER // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def done(self) -> None:
        """The reply is no longer read: stop its silence timer."""
        self.in_use = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def reusable(self) -> bool:
        return (
            self.complete
            and self.error is None
            and self.status >= 200
            and self.transport is not None
            and not self.transport.is_closing()
            and self.keep_alive
        )

    def close(self) -> None:
        self.done()
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_silence(self) -> None:
        self._timer = None
        if self.complete or self.error is not None:
            return
        if self._paused:  # the reader is behind, not the shard: silence is not the shard's
            self._heard = self._loop.time()
        silent_until = self._heard + self._read_timeout
        if self._loop.time() < silent_until:
            self._timer = self._loop.call_at(silent_until, self._check_silence)
            return
        self._fail(TimeoutError(f"was silent for longer than the read timeout ({self._read_timeout:g} s)"))
        self.close()


class Reply:
    """A shard's reply, once its headers are in; read its body with :meth:`next_chunk` or :meth:`read`, then
    :meth:`close` (the ``async with`` form does) to give the connection back or close it."""

    def __init__(self, client: ShardClient, connection: _Connection) -> None:
        self._client = client
        self._connection: _Connection | None = connection
        self._raw_headers = connection.raw_headers
        self.status = connection.status
        self.content_length = connection.content_length
        """Its Content-Length header (None without one, or not a number)."""
        self.content_type = connection.content_type
        """Its Content-Type header (None without one)."""

    @functools.cached_property
    def headers(self) -> CIMultiDictProxy[str]:
        """All of its headers (built on first use: relaying a reply needs only the two above)."""
        return CIMultiDictProxy(
            CIMultiDict((name.decode("latin-1"), value.decode("latin-1")) for name, value in self._raw_headers)
        )

    async def next_chunk(self) -> bytes:
        """The next bytes of the body as they came; ``b""`` at its end."""
        assert self._connection is not None, "the reply is closed"
        return await self._connection.next_chunk()

    async def read(self, limit: int) -> bytes:
        """The whole body; :class:`OverflowError` past ``limit`` bytes."""
        buffer = bytearray()
        while chunk := await self.next_chunk():
            buffer += chunk
            if len(buffer) > limit:
                raise OverflowError(limit)
        return bytes(buffer)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._client._release(connection)

    async def __aenter__(self) -> Reply:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ShardClient:
    """Kept-alive HTTP/1.1 connections to the shards, one idle list per address.

    ::

        client = ShardClient(connect_timeout=5, read_timeout=120)
        async with await client.request(shard.endpoint, "POST", "/v1/completions", body) as reply:
            body = await reply.read(limit)
        await client.aclose()
    """

    def __init__(self, *, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: dict[_Address, list[_Connection]] = {}
        self.connections_opened = 0
        """Connections made so far (reuse shows as fewer of them than requests)."""

    async def request(self, endpoint: str, method: str, path: str, body: bytes | None = None) -> Reply:
        """Send one request to the shard at ``endpoint``; the reply once its headers are in.

        A kept-alive connection that closes before any byte of its reply is the shard closing it while it was idle
        (servers may, at any time): the request is sent again, once, on a new connection, so that race is never
        the shard's failure. A shard that really went away refuses the new connection."""
        target = _endpoint(endpoint)
        head = b"%s %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: rollout-fleet-router\r\nAccept: */*\r\n" % (
            method.encode("ascii"),
            target.base,
            path.encode("ascii"),
            target.authority,
        )
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            data = head + body
        else:
            data = head + b"\r\n"
        address = target.address
        connection = self._take(address)
        if connection is not None:
            try:
                return await self._exchange(connection, data)
            except ConnectionError:
                if connection.answered:
                    raise
        return await self._exchange(await self._connect(address), data)

    async def _exchange(self, connection: _Connection, data: bytes) -> Reply:
        try:
            connection.send(data)
            while not connection.headers_done:
                await connection.wait()
        except BaseException:
            connection.close()
            raise
        return Reply(self, connection)

    def _take(self, address: _Address) -> _Connection | None:
        idle = self._idle.get(address)
        if not idle:
            return None
        oldest_usable = asyncio.get_running_loop().time() - KEEPALIVE_SECONDS
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if transport is not None and not transport.is_closing() and connection.idle_since >= oldest_usable:
                return connection
            connection.close()
        return None

    async def _connect(self, address: _Address) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = _tls_context() if address.tls else None
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop, address, self.read_timeout),
                    address.host,
                    address.port,
                    ssl=tls,
                    server_hostname=address.host if tls else None,
                )
        except TimeoutError:
            raise TimeoutError(f"did not accept a connection within {self.connect_timeout:g} s") from None
        self.connections_opened += 1
        return connection

    def _release(self, connection: _Connection) -> None:
        connection.done()
        if not connection.reusable:
            connection.close()
            return
        idle = self._idle.setdefault(connection.address, [])
        if len(idle) >= _MAX_IDLE_PER_SHARD:
            connection.close()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        idle.append(connection)

    async def aclose(self) -> None:
        """Close every idle connection (those in use close with their replies)."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
