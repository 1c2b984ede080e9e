"""The router's client to its shards (rollout_runtime.router.client) against real servers on 127.0.0.1: aiohttp
servers for well-formed replies, raw asyncio servers for what a broken or hostile shard sends."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from rollout_runtime.failures import GenerationUnavailable, RolloutTimeout
from rollout_runtime.router import client as client_module
from rollout_runtime.router.client import MAX_HEADER_BYTES, InvalidResponse, ShardClient
from rollout_runtime.router.upstream import Forward, ShardRejected, forward_attempt
from rollout_runtime.shards.model import Shard
from support.deadlines import within
from support.httpserver import refused_url, serve

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


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
async def shard_client() -> AsyncIterator[ShardClient]:
    client = ShardClient(connect_timeout=5.0, read_timeout=0.3)
    yield client
    await client.aclose()


def counting_app(seen: list[tuple[str, str, str, bytes, int]]) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        assert request.transport is not None
        port = request.transport.get_extra_info("peername")[1]
        seen.append((request.method, request.path, request.headers["Host"], await request.read(), port))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


async def test_requests_reuse_one_connection_and_say_what_they_are(shard_client: ShardClient) -> None:
    seen: list[tuple[str, str, str, bytes, int]] = []
    async with serve(counting_app(seen)) as url:
        for index in range(5):
            async with await within(
                shard_client.request(url + "/base/", "POST", "/v1/completions", b'{"i": %d}' % index), "a reply"
            ) as reply:
                assert reply.status == 200
                assert reply.headers["content-type"].startswith("application/json")
                assert await reply.read(1024) == b'{"ok": true}'
        async with await within(shard_client.request(url, "GET", "/v1/models"), "a reply") as reply:
            await reply.read(1024)
    host = url.removeprefix("http://")
    assert [(method, path, header, body) for method, path, header, body, _ in seen] == [
        *(("POST", "/base/v1/completions", host, b'{"i": %d}' % index) for index in range(5)),
        ("GET", "/v1/models", host, b""),
    ]
    assert len({port for *_, port in seen}) == 1, "every request should have gone over the first connection"
    assert shard_client.connections_opened == 1


async def test_a_connection_is_not_reused_when_the_shard_says_close_or_the_reply_was_not_read(
    shard_client: ShardClient,
) -> None:
    async def closing(request: web.Request) -> web.Response:
        return web.Response(text="bye", headers={"Connection": "close"})

    release = asyncio.Event()

    async def unfinished(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "100000"})
        await response.prepare(request)
        await response.write(b"x" * 1000)
        await release.wait()
        return response

    app = web.Application()
    app.router.add_get("/close", closing)
    app.router.add_get("/unfinished", unfinished)
    async with serve(app) as url:
        for _ in range(2):
            async with await within(shard_client.request(url, "GET", "/close"), "a reply") as reply:
                assert await reply.read(1024) == b"bye"
        assert shard_client.connections_opened == 2
        for _ in range(2):
            async with await within(shard_client.request(url, "GET", "/unfinished"), "a reply") as reply:
                assert reply.content_length == 100_000  # closed before its body ended: the connection is not clean
        assert shard_client.connections_opened == 4
        release.set()


async def test_an_idle_connection_past_the_keepalive_is_not_reused(
    shard_client: ShardClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "KEEPALIVE_SECONDS", -1.0)  # every idle connection is too old
    seen: list[tuple[str, str, str, bytes, int]] = []
    async with serve(counting_app(seen)) as url:
        for _ in range(2):
            async with await within(shard_client.request(url, "GET", "/"), "a reply") as reply:
                await reply.read(64)
    assert len({port for *_, port in seen}) == 2
    assert shard_client.connections_opened == 2


async def test_a_connection_the_shard_closed_while_idle_is_never_a_failed_request(shard_client: ShardClient) -> None:
    """The shard closes each connection after its reply without saying so: whether the client sees the close before
    it reuses the connection or only after sending on it, every request is answered, each on its own connection."""

    async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async with raw_server(once_then_close) as (url, peers):
        for _ in range(5):
            async with await within(shard_client.request(url, "POST", "/", b"{}"), "a reply") as reply:
                assert await reply.read(16) == b"ok"
    assert len(peers) == 5
    assert shard_client.connections_opened == 5


async def test_bytes_past_the_reply_are_never_read_as_the_next_requests_reply(shard_client: ShardClient) -> None:
    async def two_replies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
            await writer.drain()

    async with raw_server(two_replies) as (url, peers):
        for _ in range(3):
            async with await within(shard_client.request(url, "POST", "/", b"{}"), "a reply") as reply:
                assert await within(reply.read(64), "the body") == b"first"
    assert len(peers) == 3, "a connection that carried a second reply was reused"


def _idle_transports(client: ShardClient) -> list[object]:
    return [c.transport for idle in client._idle.values() for c in idle if c.transport is not None]


async def test_a_chunked_body_arrives_as_the_shard_sends_it(shard_client: ShardClient) -> None:
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
    async with serve(app) as url, await within(shard_client.request(url, "POST", "/stream", b"{}"), "headers") as reply:
        assert await within(reply.next_chunk(), "the first chunk") == b"data: 1\n\n"
        second.set()
        assert await within(reply.next_chunk(), "the second chunk") == b"data: [DONE]\n\n"
        assert await within(reply.next_chunk(), "the end") == b""


async def test_a_large_body_arrives_whole_and_a_close_delimited_one_ends_at_the_close(
    shard_client: ShardClient,
) -> None:
    payload = bytes(range(256)) * 16_384  # 4 MiB: past the high-water mark, so reading pauses and resumes

    async def large(request: web.Request) -> web.Response:
        return web.Response(body=payload)

    app = web.Application()
    app.router.add_get("/large", large)
    async with serve(app) as url:
        async with await within(shard_client.request(url, "GET", "/large"), "the headers") as reply:
            body = await within(reply.read(len(payload)), "the body")
        assert hashlib.sha256(body).digest() == hashlib.sha256(payload).digest()
        async with await within(shard_client.request(url, "GET", "/large"), "the headers") as reply:
            with pytest.raises(OverflowError):
                await within(reply.read(len(payload) - 1), "the body")

    async def http10(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the ")
        await writer.drain()
        writer.write(b"close")

    async with raw_server(http10) as (url, _), await within(shard_client.request(url, "GET", "/"), "headers") as reply:
        assert await within(reply.read(1024), "the body") == b"until the close"
    assert not _idle_transports(shard_client)


async def test_silence_before_or_during_the_reply_is_a_timeout(shard_client: ShardClient) -> None:
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        if b"/midway" in head:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")
        await release.wait()

    async with raw_server(silent) as (url, _):
        with pytest.raises(TimeoutError, match="silent for longer than the read timeout"):
            await within(shard_client.request(url, "GET", "/"), "the read timeout")
        async with await within(shard_client.request(url, "GET", "/midway"), "the headers") as reply:
            assert await reply.next_chunk() == b"{"
            with pytest.raises(TimeoutError):
                await within(reply.next_chunk(), "the read timeout")
        release.set()


async def test_a_shard_that_closes_refuses_or_sends_no_http_fails_with_the_taxonomys_exceptions(
    shard_client: ShardClient,
) -> None:
    async def behave(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        if b"/truncated" in head:
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choices": [')
        elif b"/garbage" in head:
            writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        elif b"/huge-headers" in head:
            writer.write(b"HTTP/1.1 200 OK\r\n" + b"X-Filler: %s\r\n" % (b"a" * 1000) * (MAX_HEADER_BYTES // 1000 + 1))
        elif b"/upgrade" in head:
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        await writer.drain()

    async with raw_server(behave) as (url, _):
        with pytest.raises(ConnectionResetError, match="before its reply"):
            await within(shard_client.request(url, "GET", "/closed"), "the close")
        async with await within(shard_client.request(url, "GET", "/truncated"), "the headers") as reply:
            with pytest.raises(ConnectionResetError, match="mid-reply"):
                await within(reply.read(1024), "the close")
        with pytest.raises(InvalidResponse, match=r"not an HTTP/1\.x reply"):
            await within(shard_client.request(url, "GET", "/garbage"), "the parse error")
        with pytest.raises(InvalidResponse, match=f"exceed {MAX_HEADER_BYTES} bytes"):
            await within(shard_client.request(url, "GET", "/huge-headers"), "the header limit")
        with pytest.raises(InvalidResponse, match="switched protocols"):
            await within(shard_client.request(url, "GET", "/upgrade"), "the upgrade")
    with pytest.raises(ConnectionRefusedError):
        await within(shard_client.request(refused_url(), "GET", "/"), "the refusal")
    assert not _idle_transports(shard_client)


async def test_an_attempt_maps_each_failure_onto_the_taxonomy(shard_client: ShardClient) -> None:
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
                    forward_attempt(shard_client, shard, Forward("POST", path, b"{}"), max_response_bytes=1500),
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
    with pytest.raises(GenerationUnavailable, match="ConnectionRefusedError"):
        await within(
            forward_attempt(shard_client, gone, Forward("POST", "/v1/completions", b"{}"), max_response_bytes=1500),
            "the refused attempt",
        )
