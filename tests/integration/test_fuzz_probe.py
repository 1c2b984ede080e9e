"""Fuzz the prober against a real HTTP server answering fuzzed statuses, headers and bodies, and raw garbage.

One aiohttp server on 127.0.0.1 answers ``/health`` and ``/v1/models`` with whatever the current example scripts;
a second, raw TCP server writes arbitrary bytes as its "response". The invariants are the prober's contract: it never
raises, it says ok exactly when the health check is 2xx and (for a model) ``/v1/models`` is a 2xx OpenAI model list
naming the model within the size bound, a 3xx is never followed, and every failure has a bounded label and message.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_runtime.health import HttpProber, ProbeReason, ProbeSettings, ProbeTargetPolicy
from support.chaos import write_tally

TALLY: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def fuzz_report() -> Iterator[None]:
    yield
    write_tally("fuzz-probe", TALLY)


LIMIT = 2048
MODEL = "fuzz-model"
PROBE = ProbeSettings(period_seconds=5.0, timeout_seconds=2.0, failure_threshold=1, success_threshold=1)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunked: bool = False


@dataclass
class Script:
    health: Reply = field(default_factory=Reply)
    models: Reply = field(default_factory=Reply)
    trapped: int = 0
    """Requests that followed a redirect to /trap (must stay 0)."""


SCRIPT = Script()


async def _answer(request: web.Request, reply: Reply) -> web.StreamResponse:
    if reply.chunked:
        response = web.StreamResponse(status=reply.status, headers=reply.headers)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(reply.body), 700):
            await response.write(reply.body[start : start + 700])
        await response.write_eof()
        return response
    return web.Response(status=reply.status, headers=reply.headers, body=reply.body)


@pytest.fixture
async def fuzz_server() -> AsyncIterator[str]:
    async def health(request: web.Request) -> web.StreamResponse:
        return await _answer(request, SCRIPT.health)

    async def models(request: web.Request) -> web.StreamResponse:
        return await _answer(request, SCRIPT.models)

    async def trap(request: web.Request) -> web.Response:
        SCRIPT.trapped += 1
        return web.Response(status=200, text=json.dumps({"data": [{"id": MODEL}]}))

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/trap", trap)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def prober() -> AsyncIterator[HttpProber]:
    async with HttpProber(ProbeTargetPolicy.local(), max_body_bytes=LIMIT) as instance:
        yield instance


statuses = st.integers(200, 599).filter(lambda s: s not in (204, 205, 304))  # no-body statuses: tested below
header_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20).map(lambda s: "x-" + s)
header_values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=100)
extra_headers = st.dictionaries(header_names, header_values, max_size=4) | st.fixed_dictionaries(
    {"Content-Encoding": st.sampled_from(["gzip", "br", "deflate", "identity"])}
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
model_entries = st.lists(
    st.fixed_dictionaries({"id": st.sampled_from([MODEL, "other", ""]) | st.text(max_size=20)}) | json_values,
    max_size=6,
)
model_bodies = st.one_of(
    st.binary(max_size=3 * LIMIT),
    json_values.map(lambda v: json.dumps(v).encode()),
    model_entries.map(lambda d: json.dumps({"object": "list", "data": d}).encode()),
    st.integers(LIMIT - 64, 2 * LIMIT).map(  # a well-formed list around the size bound
        lambda n: json.dumps({"data": [{"id": MODEL}], "pad": "x" * n}).encode()
    ),
)
replies = st.builds(
    Reply,
    status=statuses | st.sampled_from([301, 302, 307, 308]),
    headers=extra_headers,
    body=st.binary(max_size=3 * LIMIT),
    chunked=st.booleans(),
)


def expected_ok(health: Reply, models: Reply | None) -> bool:
    if not 200 <= health.status < 300 or len(health.body) > LIMIT:
        return False
    if models is None:
        return True
    if not 200 <= models.status < 300 or len(models.body) > LIMIT:
        return False
    try:
        payload: Any = json.loads(models.body)
    except (ValueError, RecursionError):
        return False
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        return False
    entries = payload["data"]
    if not all(isinstance(e, dict) and isinstance(e.get("id"), str) for e in entries):
        return False
    return any(e["id"] == MODEL for e in entries)


@FUZZ
@given(health=replies, models=st.builds(Reply, status=statuses, headers=extra_headers, body=model_bodies,
                                        chunked=st.booleans()), expect_model=st.booleans())  # fmt: skip
async def test_probe_verdict_follows_status_size_and_model_list_and_never_raises(
    prober: HttpProber, fuzz_server: str, health: Reply, models: Reply, expect_model: bool
) -> None:
    """ok exactly when /health is 2xx within the bound and, when a model is expected, /v1/models is a 2xx model
    list within the bound that names it; otherwise a failure with a bounded label and message. Never raises."""
    TALLY["test_probe_verdict_follows_status_size_and_model_list_and_never_raises"] += 1
    if 300 <= health.status < 400:
        health.headers["Location"] = f"{fuzz_server}/trap"
    SCRIPT.health, SCRIPT.models, SCRIPT.trapped = health, models, 0
    result = await prober.probe(fuzz_server, PROBE, expected_model=MODEL if expect_model else None)
    assert result.ok is expected_ok(health, models if expect_model else None), (result, health.status)
    assert isinstance(result.reason, ProbeReason)
    assert len(result.message) <= 512
    assert SCRIPT.trapped == 0, "a redirect was followed"
    if 300 <= health.status < 400:
        assert result.reason is ProbeReason.REDIRECT
    elif 200 <= health.status < 300 and len(health.body) > LIMIT:
        assert result.reason is ProbeReason.TOO_LARGE
    elif not 200 <= health.status < 300:
        assert result.reason is ProbeReason.STATUS
        assert result.status == health.status


@pytest.mark.parametrize("status", [204, 205])
async def test_bodiless_success_statuses_are_healthy(prober: HttpProber, fuzz_server: str, status: int) -> None:
    SCRIPT.health = Reply(status=status)
    assert (await prober.probe(fuzz_server, PROBE)).ok


@pytest.fixture
async def raw_server() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A TCP server that answers every connection with the bytes at the head of the list, then closes."""
    script: list[bytes] = [b""]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(script[0])
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", script
    finally:
        server.close()
        await server.wait_closed()


status_lines = st.sampled_from(
    [b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 500 Oops\r\n", b"HTTP/1.0 200\r\n", b"HTTP/9.9 200 OK\r\n", b"", b"200\r\n"]
)
raw_headers = st.lists(
    st.sampled_from(
        [
            b"Content-Length: 5\r\n",
            b"Content-Length: -1\r\n",
            b"Content-Length: 99999999999999999999\r\n",
            b"Content-Length: 10\r\nContent-Length: 3\r\n",
            b"Transfer-Encoding: chunked\r\n",
            b"Transfer-Encoding: gzip, chunked\r\n",
            b"Location: http://169.254.169.254/\r\n",
            b"X-Folded: a\r\n b\r\n",
            b"\x00\xff: \x01\r\n",
            b"NoColonHere\r\n",
        ]
    ),
    max_size=4,
)


@FUZZ
@given(status=status_lines, headers=raw_headers, tail=st.binary(max_size=300), terminate=st.booleans())
async def test_garbage_responses_become_labelled_failures_never_exceptions(
    prober: HttpProber, raw_server: tuple[str, list[bytes]], status: bytes, headers: list[bytes], tail: bytes,
    terminate: bool,
) -> None:  # fmt: skip
    """Whatever bytes a target writes back (broken status lines, contradictory lengths, bad chunking, binary junk,
    a close mid-response), the probe returns a result with a bounded label and message; it never raises."""
    TALLY["test_garbage_responses_become_labelled_failures_never_exceptions"] += 1
    url, script = raw_server
    script[0] = status + b"".join(headers) + (b"\r\n" if terminate else b"") + tail
    result = await prober.probe(url, PROBE, expected_model=None)
    assert isinstance(result.reason, ProbeReason)
    assert len(result.message) <= 512
    if result.ok:
        assert status.startswith(b"HTTP/1.")
        assert b" 200" in status
