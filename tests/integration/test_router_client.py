"""The router's side towards its shards (``router/upstream.py`` over aiohttp's client) against real servers on
127.0.0.1: aiohttp servers for well-formed replies, raw asyncio servers for what a broken or hostile shard sends."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp
import pytest
from aiohttp import web

from rollout_runtime.failures import GenerationUnavailable, RolloutTimeout
from rollout_runtime.router.upstream import (
    Forward,
    Relayed,
    ShardRejected,
    StreamInterrupted,
    StreamRelay,
    forward_attempt,
    shard_session,
)
from rollout_runtime.shards.model import Shard
from support.deadlines import within
from support.httpserver import refused_url, serve

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
LIMIT = 8 * 1024 * 1024
COMPLETION = b'{"choices": [{"index": 0, "text": "ok"}]}'


@contextlib.asynccontextmanager
async def raw_server(handler: RawHandler) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server on 127.0.0.1 running ``handler`` per connection; yields its URL and each connection's peer port."""
    peers: list[int] = []

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[1])
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", peers
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))
    return head


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with shard_session(connect_timeout=5.0, read_timeout=0.3) as client:
        yield client


async def attempt(
    session: aiohttp.ClientSession, url: str, path: str, body: bytes | None = b"{}", *, limit: int = LIMIT
) -> Relayed:
    forward = Forward("POST" if body is not None else "GET", path, body)
    return await within(
        forward_attempt(session, Shard(name="s", endpoint=url), forward, max_response_bytes=limit), f"{path}'s answer"
    )


async def failed(
    session: aiohttp.ClientSession, url: str, path: str, body: bytes | None = b"{}", *, limit: int = LIMIT
) -> BaseException:
    with pytest.raises(Exception) as caught:
        await attempt(session, url, path, body, limit=limit)
    return caught.value


class Collected:
    """A client's side of a stream: the chunks written to it, and when each arrived."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.arrived = asyncio.Event()
        self.relay = StreamRelay(self.open)

    async def open(self, shard: Shard, passed: Mapping[str, str], attempt: int) -> Callable[[bytes], Awaitable[None]]:
        async def write(chunk: bytes) -> None:
            self.chunks.append(chunk)
            self.arrived.set()

        return write


def counting_app(seen: list[tuple[str, str, str, bytes, int]]) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        assert request.transport is not None
        port = request.transport.get_extra_info("peername")[1]
        seen.append((request.method, request.path, request.headers["Host"], await request.read(), port))
        return web.Response(body=COMPLETION, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


async def test_requests_reuse_one_connection_and_say_what_they_are(session: aiohttp.ClientSession) -> None:
    seen: list[tuple[str, str, str, bytes, int]] = []
    async with serve(counting_app(seen)) as url:
        for index in range(5):
            relayed = await attempt(session, url + "/base/", "/v1/completions", b'{"i": %d}' % index)
            assert relayed.status == 200
            assert relayed.headers["Content-Type"].startswith("application/json")
            assert relayed.body == COMPLETION
        await attempt(session, url, "/v1/models", None)
    host = url.removeprefix("http://")
    assert [(method, path, header, body) for method, path, header, body, _ in seen] == [
        *(("POST", "/base/v1/completions", host, b'{"i": %d}' % index) for index in range(5)),
        ("GET", "/v1/models", host, b""),
    ]
    assert len({port for *_, port in seen}) == 1, "every request should have gone over the first connection"


async def test_a_connection_the_shard_closed_while_idle_is_never_a_failed_request(
    session: aiohttp.ClientSession,
) -> None:
    """The shard closes each connection after its reply without saying so: whether the client sees the close before
    it reuses the connection or only after sending on it, every request is answered, each on its own connection."""

    async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async with raw_server(once_then_close) as (url, peers):
        for _ in range(5):
            assert (await attempt(session, url, "/")).body == b"ok"
    assert len(peers) == 5


async def test_bytes_past_the_reply_are_never_read_as_the_next_requests_reply(session: aiohttp.ClientSession) -> None:
    async def two_replies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
            await writer.drain()

    async with raw_server(two_replies) as (url, _):
        for _ in range(3):
            with contextlib.suppress(GenerationUnavailable):  # or the connection is refused for it: never "second"
                assert (await attempt(session, url, "/")).body == b"first"


async def test_a_stream_arrives_as_the_shard_sends_it(session: aiohttp.ClientSession) -> None:
    second = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b"data: 1\n\n")
        await second.wait()  # the client must have the first chunk before the second exists
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/stream", stream)
    client = Collected()
    forward = Forward("POST", "/stream", b"{}", relay=client.relay)
    async with serve(app) as url:
        relaying = asyncio.ensure_future(
            forward_attempt(session, Shard(name="s", endpoint=url), forward, max_response_bytes=LIMIT)
        )
        await within(client.arrived.wait(), "the first chunk")
        first = list(client.chunks)
        second.set()
        relayed = await within(relaying, "the end of the stream")
    assert first == [b"data: 1\n\n"]
    assert b"".join(client.chunks) == b"data: 1\n\ndata: [DONE]\n\n"
    assert relayed.streamed_bytes == len(b"data: 1\n\ndata: [DONE]\n\n")


async def test_a_large_body_arrives_whole_and_a_close_delimited_one_ends_at_the_close(
    session: aiohttp.ClientSession,
) -> None:
    payload = bytes(range(256)) * 16_384  # 4 MiB

    async def large(request: web.Request) -> web.Response:
        return web.Response(body=payload)

    app = web.Application()
    app.router.add_get("/large", large)
    async with serve(app) as url:
        body = (await attempt(session, url, "/large", None)).body
        assert hashlib.sha256(body).digest() == hashlib.sha256(payload).digest()
        too_large = await failed(session, url, "/large", None, limit=len(payload) - 1)
        assert isinstance(too_large, GenerationUnavailable)
        assert "larger than" in str(too_large)

    async def http10(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the ")
        await writer.drain()
        writer.write(b"close")

    async with raw_server(http10) as (url, _):
        assert (await attempt(session, url, "/", None)).body == b"until the close"


async def test_silence_before_or_during_the_reply_is_a_timeout(session: aiohttp.ClientSession) -> None:
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        if b"/midway" in head:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: {\n\n\r\n")
        await release.wait()

    async with raw_server(silent) as (url, _):
        before = await failed(session, url, "/")
        assert isinstance(before, RolloutTimeout), before
        client = Collected()
        forward = Forward("POST", "/midway", b"{}", relay=client.relay)
        with pytest.raises(StreamInterrupted, match="silent for longer than the read timeout"):
            await within(
                forward_attempt(session, Shard(name="s", endpoint=url), forward, max_response_bytes=LIMIT),
                "the read timeout mid-stream",
            )
        assert client.chunks == [b"data: {\n\n"]
        release.set()


async def test_a_shard_that_closes_refuses_or_sends_no_http_fails_with_the_taxonomys_exceptions(
    session: aiohttp.ClientSession,
) -> None:
    async def behave(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        if b"/truncated" in head:
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choices": [')
        elif b"/garbage" in head:
            writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        elif b"/huge-headers" in head:
            writer.write(b"HTTP/1.1 200 OK\r\n" + b"X-Filler: %s\r\n" % (b"a" * 1000) * 80)
        elif b"/upgrade" in head:
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        await writer.drain()

    async with raw_server(behave) as (url, _):
        for path in ("/closed", "/truncated", "/garbage", "/huge-headers", "/upgrade"):
            failure = await failed(session, url, path)
            assert isinstance(failure, GenerationUnavailable), (path, failure)
    refused = await failed(session, refused_url(), "/")
    assert isinstance(refused, GenerationUnavailable)
    assert "ClientConnectorError" in str(refused)


async def test_an_attempt_maps_each_failure_onto_the_taxonomy(session: aiohttp.ClientSession) -> None:
    """What forward_attempt makes of the client's exceptions and of the shard's statuses."""

    async def behave(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        path = head.split(b" ", 2)[1]
        if path == b"/redirect":
            writer.write(
                b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://elsewhere.example/x?key=1\r\n"
                b"Content-Length: 0\r\n\r\n"
            )
        elif path == b"/unavailable":
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
        elif path == b"/rejected":
            body = b'{"object": "error", "message": "bad"}'
            writer.write(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
        elif path == b"/large":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"x" * 1024 + b"\r\n")
            writer.write(b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n")
        elif path == b"/garbage":
            writer.write(b"\x00\x01\x02 not http\r\n\r\n")
        elif path == b"/silent":
            await asyncio.Event().wait()
        await writer.drain()

    async with raw_server(behave) as (url, _):
        shard = Shard(name="s", endpoint=url)

        async def attempt(path: str) -> BaseException:
            with pytest.raises(Exception) as caught:
                await within(
                    forward_attempt(session, shard, Forward("POST", path, b"{}"), max_response_bytes=1500),
                    f"the attempt on {path}",
                )
            return caught.value

        redirect = await attempt("/redirect")
        assert isinstance(redirect, GenerationUnavailable)
        assert "redirects are never followed" in str(redirect)
        assert "key=1" not in str(redirect)
        assert isinstance(await attempt("/unavailable"), GenerationUnavailable)
        rejected = await attempt("/rejected")
        assert isinstance(rejected, ShardRejected)
        assert (rejected.status, rejected.body) == (400, b'{"object": "error", "message": "bad"}')
        large = await attempt("/large")
        assert isinstance(large, GenerationUnavailable)
        assert "larger than 1500 bytes" in str(large)
        garbage = await attempt("/garbage")
        assert isinstance(garbage, GenerationUnavailable)
        assert "invalid HTTP response" in str(garbage)
        silent = await attempt("/silent")
        assert isinstance(silent, RolloutTimeout)
        assert "read timeout" in str(silent)
    gone = Shard(name="gone", endpoint=refused_url())
    with pytest.raises(GenerationUnavailable, match="ClientConnectorError"):
        await within(
            forward_attempt(session, gone, Forward("POST", "/v1/completions", b"{}"), max_response_bytes=1500),
            "the refused attempt",
        )
