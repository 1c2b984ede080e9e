"""One attempt of one routed request on one shard: the dispatcher's ``rollout(shard, forward)`` for the router.

Sent with aiohttp's client (:func:`shard_session`: kept-alive connections per shard, the read timeout as the longest
silence). What a shard's answer means is the generation client's mapping (:mod:`rollout_runtime.generation`),
applied to relayed bytes instead of parsed completions:

- cannot connect, dropped, silent past the read timeout, not HTTP/1.x, a 5xx/408/425/429, a redirect -> infra
  (retried on another shard, the shard passively ejected when it is to blame);
- any other 4xx -> :class:`ShardRejected` (data): the request's own fault, relayed to the client as the shard said
  it, never retried;
- a 2xx is judged as the generation client judges one (:func:`~rollout_runtime.generation.judge_completion`,
  :func:`~rollout_runtime.generation.judge_stream_start`) before any of it reaches the client: a completion route's
  answer that is not a completion (invalid or truncated JSON, ``choices: []``, an error object inside a 200, a stream
  whose first event is one) is infra with status 200, so the dispatcher redispatches it and weighs it against the
  shard as it does for the library. A non-streamed body is read (bounded), judged whole and handed back; a stream is
  judged by its first event, then relayed as it arrives.

A stream is *committed* once the client's response is opened for its first byte (its headers may be out even if
opening fails): from then on it cannot move to another shard (:attr:`Forward.retry_refused` tells the dispatcher).
If the shard fails after that, the attempt raises :class:`StreamInterrupted` (infra, blaming the shard, so it is
ejected as any failure would), and the request handler ends the client's stream with an error event. A stream that
ends without ``data: [DONE]`` is interrupted too: a truncation is never passed off as an answer. If opening the
client's response fails (the router's side, not the shard's), the attempt raises :class:`StreamOpenFailed` and the
stream ends with the same error event.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import aiohttp
from yarl import URL

from rollout_runtime import http_verdicts
from rollout_runtime.failures import GenerationUnavailable, RolloutDataFailure, RolloutTimeout, http_status_is_infra
from rollout_runtime.generation import judge_completion, judge_stream_start
from rollout_runtime.redaction import redact_url, redirect_message, safe_message
from rollout_runtime.shards.model import Shard

__all__ = [
    "KEEPALIVE_SECONDS",
    "Forward",
    "Relayed",
    "ShardRejected",
    "StreamInterrupted",
    "StreamOpenFailed",
    "StreamRelay",
    "forward_attempt",
    "shard_session",
]

_DONE: Final[bytes] = b"data: [DONE]"
KEEPALIVE_SECONDS: Final[float] = 4.0
"""An idle connection to a shard is closed after this long: under the 5 s after which uvicorn (vLLM) and
cpp-httplib (llama.cpp) close idle connections, so the router seldom sends a request into one the shard is closing
(and :func:`forward_attempt` sends once more on a fresh connection when it does)."""
_HEADERS: Final[Mapping[str, str]] = {"Content-Type": "application/json"}
_JUDGED: Final[Mapping[str, bool]] = {"/v1/completions": False, "/v1/chat/completions": True}
"""The routes whose 2xx must be a completion, and whether it is a chat one."""


class ShardRejected(RolloutDataFailure):
    """A shard answered the request with a 4xx that is the request's fault; the router relays it as it came."""

    def __init__(self, message: str, *, status: int, body: bytes, content_type: str) -> None:
        super().__init__(message, status=status)
        self.body = body
        self.content_type = content_type


class StreamInterrupted(GenerationUnavailable):
    """A shard failed after its stream's first byte reached the client: the stream ends with an error event."""


class StreamOpenFailed(Exception):
    """Opening the client's stream failed once it was committed: not the shard's fault (no ejection), no retry."""


class ClientGone(Exception):
    """The client closed its connection while a stream was relayed: nobody's failure, nothing to retry."""


@dataclass(frozen=True, slots=True)
class Relayed:
    """A shard's complete answer to a non-streamed request (or the summary of a relayed stream)."""

    shard: Shard
    status: int
    headers: Mapping[str, str]
    body: bytes = b""
    streamed_bytes: int = 0
    client_gone: bool = False


Opener = Callable[[Shard, Mapping[str, str], int], Awaitable[Callable[[bytes], Awaitable[None]]]]
"""Called once, with the shard, its passed headers and the attempt's number, before a stream's first byte:
prepares the client's response and returns the function that writes bytes to it."""


@dataclass(eq=False, slots=True)
class StreamRelay:
    """The client's side of one streamed request, shared by every attempt of it."""

    open: Opener
    committed_to: Shard | None = None
    """The shard whose bytes the client is receiving (None until the first byte)."""
    interrupted: str | None = None
    """Why the stream broke after it was committed (None: it did not)."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a committed stream stops, cleanly or not: the request's answer is then fixed."""


@dataclass(eq=False, slots=True)
class Forward:
    """One client request as the dispatcher's prompt: what to send, and the session it belongs to."""

    method: str
    path: str
    body: bytes | None = None
    affinity: str | None = None
    """Session key: :mod:`rollout_runtime.dispatch.affinity` keeps the session on one shard while it is routable."""
    relay: StreamRelay | None = None
    """Set for ``"stream": true`` requests."""
    attempts: int = 0
    """Attempts that reached a shard so far."""
    rejected: ShardRejected | None = None
    """The shard's 4xx for this request, to relay as it came (set by the attempt that got it)."""

    @property
    def retry_refused(self) -> str | None:
        """Why no other shard may answer (the dispatcher reads it before a retry): a committed stream."""
        relay = self.relay
        if relay is None or relay.committed_to is None:
            return None
        return relay.interrupted or f"the stream from shard {relay.committed_to.name} already reached the client"


def shard_session(*, connect_timeout: float, read_timeout: float) -> aiohttp.ClientSession:
    """The router's one client to its shards: aiohttp's, with connections kept alive per shard (no limit on their
    number: the router's ``max_concurrency`` bounds them), ``read_timeout`` as the longest silence (before a reply's
    first byte or between two), no cookies kept (one client's cookie must never reach another's request) and no
    proxy from the environment."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        headers={"User-Agent": "rollout-fleet-router"},
        skip_auto_headers=("Accept-Encoding",),  # relayed as they come: the client gets what it would from the shard
    )


def _where(shard: Shard) -> str:
    return _where_named(shard.name, shard.endpoint)


@functools.lru_cache(maxsize=1024)
def _where_named(name: str, endpoint: str) -> str:
    """Once per shard, not per request: redacting a URL is regex work on the router's hot path."""
    return f"shard {name} ({redact_url(endpoint)})"


@functools.lru_cache(maxsize=4096)
def _url(endpoint: str, path: str) -> URL:
    """Parsed once per shard and route."""
    return URL(endpoint.rstrip("/") + path)


async def _read_bounded(reply: aiohttp.ClientResponse, limit: int, where: str) -> bytes:
    too_large = f"{where}: response larger than {limit} bytes"
    length = reply.content_length
    if length is not None and length > limit:
        raise GenerationUnavailable(too_large, status=reply.status)
    if length is not None:
        return await reply.read()
    buffer = bytearray()
    while chunk := await reply.content.readany():
        buffer += chunk
        if len(buffer) > limit:
            raise GenerationUnavailable(too_large, status=reply.status)
    return bytes(buffer)


async def _check_status(reply: aiohttp.ClientResponse, where: str, limit: int) -> None:
    """Raise the taxonomy's failure for a reply that is not a 2xx (before any of it reaches the client)."""
    status = reply.status
    if 200 <= status < 300:
        return
    if 300 <= status < 400:  # never followed: the request and any key would go to a host that is not a shard
        raise GenerationUnavailable(redirect_message(where, status, reply.headers), status=status)
    if status < 200:
        raise GenerationUnavailable(safe_message(f"{where} answered HTTP {status}"), status=status)
    body = await _read_bounded(reply, limit, where)
    if http_status_is_infra(status):
        retry_after = http_verdicts.retry_after_seconds(reply.headers)
        raise GenerationUnavailable(
            safe_message(f"{where} answered HTTP {status}"), status=status, retry_after=retry_after
        )
    content_type = reply.headers.get("Content-Type") or "application/json"
    raise ShardRejected(f"{where} answered HTTP {status}", status=status, body=body, content_type=content_type)


def _passed(reply: aiohttp.ClientResponse) -> dict[str, str]:
    """The shard's headers the client gets too: its Content-Type."""
    content_type = reply.headers.get("Content-Type")
    return {"Content-Type": content_type} if content_type is not None else {}


async def _send(session: aiohttp.ClientSession, shard: Shard, forward: Forward) -> aiohttp.ClientResponse:
    """The shard's reply, once its headers are in. A kept-alive connection that closes before any byte of its
    reply is the shard closing it while it was idle (servers may, at any time): the request goes once more, on a
    fresh connection, so that race is never the shard's failure. A shard that really went away refuses it."""
    url = _url(shard.endpoint, forward.path)
    headers = _HEADERS if forward.body is not None else None
    try:
        return await session.request(forward.method, url, data=forward.body, headers=headers, allow_redirects=False)
    except aiohttp.ClientConnectorError:  # could not connect: no kept-alive connection was involved
        raise
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):  # closed before the reply's first byte
        pass
    return await session.request(forward.method, url, data=forward.body, headers=headers, allow_redirects=False)


async def forward_attempt(
    session: aiohttp.ClientSession, shard: Shard, forward: Forward, *, max_response_bytes: int
) -> Relayed:
    """Send ``forward`` to ``shard``; raise taxonomy failures only (see the module docstring)."""
    relay = forward.relay
    if relay is not None and relay.committed_to is not None:  # retry_refused keeps the dispatcher from this
        raise StreamOpenFailed(f"the stream already went to shard {relay.committed_to.name}: no second shard")
    forward.attempts += 1
    where = _where(shard)
    try:
        async with await _send(session, shard, forward) as reply:
            await _check_status(reply, where, max_response_bytes)
            chat = _JUDGED.get(forward.path)
            if relay is None:
                body = await _read_bounded(reply, max_response_bytes, where)
                if chat is not None:
                    judge_completion(shard, body, chat=chat)
                return Relayed(shard, reply.status, _passed(reply), body)
            first = await _stream_start(reply, shard, where, chat, max_response_bytes)
            return await _relay_stream(reply, first, shard, relay, where, forward.attempts)
    except ShardRejected as exc:
        forward.rejected = exc
        raise
    except (RolloutDataFailure, GenerationUnavailable):
        raise
    except ClientGone:
        return Relayed(shard, 200, {}, client_gone=True)
    except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            raise RolloutTimeout(f"{where} did not accept a connection in time") from exc
        silent = f"{where} was silent for longer than the read timeout"
        failure = _after_commit(relay, silent)
        if failure is not None:
            raise failure from exc
        raise RolloutTimeout(silent) from exc
    except (aiohttp.ClientError, OSError) as exc:  # not HTTP; refused, reset, cut mid-reply, no route, no such host
        what = "invalid HTTP response" if isinstance(exc, aiohttp.ClientResponseError) else type(exc).__name__
        reason = safe_message(f"{where}: {what}: {exc}")
        failure = _after_commit(relay, reason)
        if failure is not None:
            raise failure from exc
        raise GenerationUnavailable(reason) from exc
    except asyncio.CancelledError:  # evicted (the shard left the healthy set) or the request ended
        _after_commit(relay, f"shard {shard.name} left the healthy set mid-stream")
        raise


def _after_commit(relay: StreamRelay | None, reason: str) -> StreamInterrupted | None:
    """Mark a committed stream interrupted; the failure to raise for it, or None if nothing was committed."""
    if relay is None or relay.committed_to is None or relay.ended.is_set():
        return None
    relay.interrupted = reason
    relay.ended.set()
    return StreamInterrupted(reason)


async def _stream_start(
    reply: aiohttp.ClientResponse, shard: Shard, where: str, chat: bool | None, limit: int
) -> bytes:
    """A stream's first bytes, up to the end of its first event that carries data, judged (when ``chat`` says the
    route's answer is a completion) before the client sees any of it."""
    content = reply.content
    first = await content.readany()
    if not first:
        raise GenerationUnavailable(f"{where} closed its stream before the first byte")
    if chat is None:
        return first
    judged_up_to = 0
    while True:
        end = _event_end(first, judged_up_to)
        if end is None:
            chunk = await content.readany()
            if not chunk:
                raise GenerationUnavailable(f"{where} ended its stream before its first event", status=reply.status)
            first += chunk
            if len(first) > limit:
                raise GenerationUnavailable(f"{where}: stream's first event larger than {limit} bytes")
            continue
        if judge_stream_start(shard, first[:end].splitlines(), chat=chat):
            return first
        judged_up_to = end


def _event_end(buffer: bytes, start: int) -> int | None:
    """Where the SSE event that starts at ``start`` ends (after its blank line); None while it is incomplete."""
    ends = [found + len(mark) for mark in (b"\n\n", b"\r\n\r\n") if (found := buffer.find(mark, start)) >= 0]
    return min(ends) if ends else None


async def _relay_stream(
    reply: aiohttp.ClientResponse, first: bytes, shard: Shard, relay: StreamRelay, where: str, attempt: int
) -> Relayed:
    content = reply.content
    relay.committed_to = shard  # from here the client may have this shard's headers: no other shard may answer
    try:
        write = await relay.open(shard, _passed(reply), attempt)
    except ConnectionError as exc:  # the client went away while its headers were sent
        relay.ended.set()
        raise ClientGone(str(exc)) from exc
    except Exception as exc:
        relay.interrupted = safe_message(f"the router could not open the stream: {type(exc).__name__}: {exc}")
        relay.ended.set()
        raise StreamOpenFailed(relay.interrupted) from exc
    sent = 0
    tail = b""
    chunk = first
    while chunk:
        try:
            await write(chunk)
        except (ConnectionError, RuntimeError) as exc:  # the client went away: the shard did nothing wrong
            relay.ended.set()
            raise ClientGone(str(exc)) from exc
        sent += len(chunk)
        tail = (tail + chunk)[-64:]
        chunk = await content.readany()
    if _DONE not in tail:
        failure = _after_commit(relay, f"{where} ended its stream without data: [DONE]")
        assert failure is not None
        raise failure
    relay.ended.set()
    return Relayed(shard, reply.status, _passed(reply), streamed_bytes=sent)
