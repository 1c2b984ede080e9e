"""The router's side towards its clients (``router/http.py``: aiohttp's server and the router's own body limit,
100-continue and HTTP/1.0 handling) against raw client sockets, read back with h11.

h11 (httpx's parser) is an independent reading of the bytes the server writes: framing, keep-alive and chunking are
checked by another implementation than the one that wrote them. Hostile or unusual clients are plain bytes on a
real loopback socket.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h11
import pytest
from aiohttp import web

from rollout_runtime.router.http import Handler, json_response, open_stream, read_body, serve
from support.deadlines import within

LIMIT = 4096
HEAD_LIMIT = 64 * 1024
"""Larger than any head aiohttp accepts (its line and field limits are 8 KiB)."""


async def echo(request: web.BaseRequest) -> web.StreamResponse:
    """Answers with what it was sent (413 past LIMIT, closing); ``/stream`` streams three chunks."""
    if request.path == "/stream":
        await read_body(request, LIMIT)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await open_stream(request, stream)
        for index in range(3):
            await stream.write(b"data: %d\n\n" % index)
        return stream
    body = await read_body(request, LIMIT)
    payload = {"method": request.method, "path": request.path, "bytes": len(body or b"")}
    answer = json_response({**payload, "too_large": body is None}, 413 if body is None else 200)
    if body is None:
        answer.force_close()
    return answer


@asynccontextmanager
async def server(handler: Handler = echo) -> AsyncIterator[int]:
    async with serve(handler, host="127.0.0.1", port=0) as port:
        yield port


class Client:
    """A raw connection; answers read with h11."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    @asynccontextmanager
    async def open(cls, port: int) -> AsyncIterator[Client]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            yield cls(reader, writer)
        finally:
            writer.close()

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def event(self) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.reader.read(65536))
                continue
            return event

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        """The next complete answer: status, headers (lower-cased), body."""
        head = await within(self.event(), "the answer's head")
        while isinstance(head, h11.InformationalResponse):
            head = await within(self.event(), "the answer's head")
        assert isinstance(head, h11.Response), head
        body = b""
        while not isinstance(event := await within(self.event(), "the answer's body"), h11.EndOfMessage):
            assert isinstance(event, h11.Data), event
            body += event.data
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        else:  # the request went out as raw bytes: read the next answer with a fresh parser, from what is left
            rest, _ = self.h11.trailing_data
            self.h11 = h11.Connection(h11.CLIENT)
            if rest:  # (no bytes at all would tell h11 the connection closed)
                self.h11.receive_data(rest)
        headers = {name.decode().lower(): value.decode() for name, value in head.headers}
        return head.status_code, headers, body

    async def closed(self) -> bool:
        """Whether the server closed the connection (read to EOF)."""
        rest = await within(self.reader.read(), "the server to close the connection")
        return rest == b""


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: router", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with server() as port, Client.open(port) as client:
        answers = []
        for size in (3, 10):
            h11_request = h11.Request(
                method="POST", target="/v1/completions?x=1", headers=[("Host", "r"), ("Content-Length", str(size))]
            )
            await client.send(client.h11.send(h11_request) + client.h11.send(h11.Data(data=b"x" * size)))
            client.h11.send(h11.EndOfMessage())
            answers.append(await client.answer())

    assert [(status, json.loads(body)) for status, _, body in answers] == [
        (200, {"method": "POST", "path": "/v1/completions", "bytes": 3, "too_large": False}),
        (200, {"method": "POST", "path": "/v1/completions", "bytes": 10, "too_large": False}),
    ]
    assert all("connection" not in headers for _, headers, _ in answers)


async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    first_running = asyncio.Event()
    release_first = asyncio.Event()
    started: list[str] = []

    async def ordered(request: web.BaseRequest) -> web.Response:
        started.append(request.path)
        if request.path == "/first":
            first_running.set()
            await release_first.wait()
        return json_response({"path": request.path})

    async with server(ordered) as port, Client.open(port) as client:
        await client.send(post("/first", b"{}") + post("/second", b"{}"))
        await within(first_running.wait(), "the first request's handler")
        running_alone = list(started)
        release_first.set()
        paths = [json.loads((await client.answer())[2])["path"] for _ in range(2)]

    assert running_alone == ["/first"]  # the second waited for the first's answer
    assert paths == ["/first", "/second"]


async def test_expect_100_continue_gets_its_go_ahead_and_the_body_is_read() -> None:
    async with server() as port, Client.open(port) as client:
        head = post("/v1/completions", b"", "Expect: 100-continue").replace(b"Content-Length: 0", b"Content-Length: 5")
        await client.send(head)
        interim = await within(client.reader.readuntil(b"\r\n\r\n"), "the 100 Continue")
        await client.send(b"hello")
        status, _, body = await client.answer()

    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert (status, json.loads(body)["bytes"]) == (200, 5)


async def test_a_declared_body_past_the_limit_is_answered_at_once_without_reading_it() -> None:
    async with server() as port, Client.open(port) as client:
        await client.send(post("/v1/completions", b"", "Expect: 100-continue").replace(b"Length: 0", b"Length: 99999"))
        status, headers, body = await client.answer()
        closed = await client.closed()

    assert (status, json.loads(body)["too_large"]) == (413, True)
    assert headers["connection"] == "close"
    assert closed


async def test_a_chunked_body_past_the_limit_is_dropped_and_the_connection_closes() -> None:
    chunk = b"a" * 1000
    chunked = b"".join(b"%x\r\n%b\r\n" % (len(chunk), chunk) for _ in range(6)) + b"0\r\n\r\n"
    async with server() as port, Client.open(port) as client:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
        await client.send(head + chunked)
        status, headers, body = await client.answer()
        closed = await client.closed()

    assert (status, json.loads(body)) == (
        413,
        {"method": "POST", "path": "/v1/completions", "bytes": 0, "too_large": True},
    )
    assert headers["connection"] == "close"
    assert closed


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
        b"GET / HTTP/1.1\r\nHost: r\r\nX: " + b"a" * HEAD_LIMIT,
    ],
    ids=["tls-hello", "huge-head"],
)
async def test_bytes_that_are_not_an_http_request_get_a_400_and_the_connection_closes(garbage: bytes) -> None:
    async with server() as port, Client.open(port) as client:
        await client.send(garbage + b"\r\n\r\n")
        raw = await within(client.reader.read(), "the 400 and the close")

    assert raw.split(b"\r\n", 1)[0] in (b"HTTP/1.0 400 Bad Request", b"HTTP/1.1 400 Bad Request"), raw[:200]
    # read to the end: the connection closed after the 400


async def test_an_http10_client_gets_its_answer_and_the_close_even_for_a_stream() -> None:
    async with server() as port:
        answers = []
        for path in ("/v1/completions", "/stream"):
            async with Client.open(port) as client:
                head = f"POST {path} HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n"
                await client.send(head.encode() + b"{}")
                answers.append(await within(client.reader.read(), "the answer up to the close"))

    plain, stream = answers
    assert b"Connection: close" in plain
    assert json.loads(plain.partition(b"\r\n\r\n")[2])["bytes"] == 2
    assert b"Transfer-Encoding" not in stream  # HTTP/1.0 has no chunking: the close ends the body
    assert stream.partition(b"\r\n\r\n")[2] == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_a_stream_is_chunked_and_a_client_gone_mid_stream_stops_its_writes() -> None:
    first_out = asyncio.Event()
    client_gone = asyncio.Event()
    write_failed = asyncio.Event()

    async def long_stream(request: web.BaseRequest) -> web.StreamResponse:
        if request.path != "/long":
            return await echo(request)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        await stream.write(b"data: first\n\n")
        first_out.set()
        await client_gone.wait()
        try:
            for _ in range(1000):  # the kernel notices the close within a few writes
                await stream.write(b"data: more\n\n" * 100)
                await asyncio.sleep(0)
        except ConnectionResetError:
            write_failed.set()
        return stream

    async with server(long_stream) as port:
        async with Client.open(port) as gone:
            await gone.send(post("/long", b"{}"))
            await within(first_out.wait(), "the stream's first chunk")
            first = await within(gone.reader.readuntil(b"data: first\n\n"), "the first chunk")
        client_gone.set()
        async with Client.open(port) as client:
            await client.send(post("/stream", b"{}"))
            status, headers, body = await client.answer()
        await within(write_failed.wait(), "the handler's write to the gone client to raise")

    assert b"Transfer-Encoding: chunked" in first
    assert (status, headers["transfer-encoding"], body) == (200, "chunked", b"data: 0\n\ndata: 1\n\ndata: 2\n\n")


async def test_a_client_that_does_not_read_holds_the_stream_back_instead_of_the_routers_memory() -> None:
    chunk = b"x" * 65536
    total = 512  # 32 MiB: far past any socket buffer
    buffered: list[int] = []

    async def big(request: web.BaseRequest) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await stream.prepare(request)
        transport = request.transport
        for _ in range(total):
            await stream.write(chunk)
            buffered.append(transport.get_write_buffer_size() if transport is not None else 0)
        return stream

    async with server(big) as port, Client.open(port) as client:
        await client.send(post("/big", b"{}"))
        status, _, body = await client.answer()

    assert status == 200
    assert len(body) == total * len(chunk)
    # without flow control every write lands in the transport's buffer at once: up to the whole 32 MiB
    assert max(buffered) < 4 * 1024 * 1024, f"the router buffered up to {max(buffered)} bytes for a slow client"
