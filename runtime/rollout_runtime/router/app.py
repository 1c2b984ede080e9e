"""``rollout-fleet router``: an OpenAI-compatible endpoint for environment and agent servers, over the dispatcher.

Every model request goes through the dispatcher (:meth:`Router.route`): its selection (least outstanding, or the
session's shard by rendezvous hashing), its classification of failures (:func:`~rollout_runtime.failures.diagnose`)
and its passive ejection, over any shard source. Retries happen only before the first byte reaches the client;
after that a failure ends the stream with an error event (see :mod:`rollout_runtime.router.upstream`).

Answers the router gives itself, without trying a shard (counted in ``router_refused_total``):

- **400** the body is not a JSON object;
- **413** the body is larger than ``max_body_bytes``;
- **429** (with ``Retry-After``) ``max_concurrency`` requests are already in flight;
- **409** no shard is routable. Not a 503: OpenAI-compatible clients (NeMo-Gym among them) retry 429/502/503/504
  without end, which turns a dead fleet into a hot loop; a 409 stops them and says why in the body. Also the answer
  to a request whose shards all left while it was being tried (after the dispatcher's healthy wait).

After trying: the shard's own 4xx is relayed as it came (the request's fault, never retried); a request whose
attempts all failed is a 502 (504 when the last one timed out) naming the shards tried; a misconfigured-fleet
verdict (every shard failing the same way) answers that request only (the shard's 4xx as it came, or a 502
``fleet_misconfigured``), never the router's end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Final

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from rollout_runtime.dispatch import (
    Completed,
    DataFailed,
    Dispatcher,
    DispatchEvent,
    DispatchSession,
    Outcome,
    SessionClosed,
    Skipped,
)
from rollout_runtime.failures import NoHealthyShards, RolloutFleetMisconfigured
from rollout_runtime.router.config import RouterConfig
from rollout_runtime.router.http import SHARD_HEADER, error_response, json_response, open_stream, read_body, serve
from rollout_runtime.router.metrics import RouterMetrics
from rollout_runtime.router.upstream import (
    Forward,
    Opener,
    Relayed,
    ShardRejected,
    StreamRelay,
    forward_attempt,
    shard_session,
)
from rollout_runtime.serving import scrape
from rollout_runtime.shards.model import Shard, ShardSource, fleet_identity

__all__ = [
    "ATTEMPTS_HEADER",
    "READY_PREFIX",
    "SHARD_HEADER",
    "WEIGHTS_HEADER",
    "Router",
    "RouterServer",
    "serve_router",
    "stream_error_event",
]

log = logging.getLogger("rollout_runtime.router")

WEIGHTS_HEADER: Final[str] = "X-Rollout-Weights-Version"
"""The weights version that shard serves, when the shard source knows it."""
ATTEMPTS_HEADER: Final[str] = "X-Rollout-Attempts"
"""Shards tried for this answer (1 unless an earlier one failed before its first byte)."""
READY_PREFIX: Final[str] = "ROUTER_READY "
"""The line ``rollout-fleet router`` prints once it listens, then JSON with host, port and pid."""

_ROUTES: Final[tuple[str, ...]] = ("/v1/completions", "/v1/chat/completions")
_MEASURED: Final[frozenset[str]] = frozenset({*_ROUTES, "/v1/models"})
_SSE_HEADERS: Final[dict[str, str]] = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _shard_headers(shard: Shard, attempts: int | None = None, weights: int | None = None) -> dict[str, str]:
    headers = {SHARD_HEADER: shard.name}
    if weights is not None:
        headers[WEIGHTS_HEADER] = str(weights)
    if attempts is not None:
        headers[ATTEMPTS_HEADER] = str(attempts)
    return headers


def stream_error_event(message: str, shard: str) -> bytes:
    """The SSE event that ends a stream a shard broke: OpenAI clients raise on an ``error`` event."""
    payload = {"error": {"message": message, "type": "stream_interrupted", "code": 502, "shard": shard}}
    return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"


class Router:
    """The router's state: one long-lived dispatcher and session (shared ejection state, workers and stats) and one
    aiohttp client session to the shards (:func:`~rollout_runtime.router.upstream.shard_session`).

    ``observer`` receives the dispatcher's events (every attempt's end, ejections), as
    :class:`~rollout_runtime.dispatch.Dispatcher`'s does.

    ::

        async with Router(LocalShardSource(shards)) as router, serve_router(router) as server:
            ...  # clients call server.url + "/v1/chat/completions"
    """

    def __init__(
        self,
        source: ShardSource,
        config: RouterConfig | None = None,
        *,
        registry: CollectorRegistry | None = None,
        observer: Callable[[DispatchEvent], None] | None = None,
    ) -> None:
        self.config = config or RouterConfig()
        self.registry = registry if registry is not None else CollectorRegistry()
        fleet, namespace = fleet_identity(source)
        self.metrics = RouterMetrics(self.registry, fleet=fleet, namespace=namespace)
        policy = self.config.dispatch_policy()
        self.dispatcher = Dispatcher(source, policy, registry=self.registry, observer=observer)
        self._client: aiohttp.ClientSession | None = None
        self._requests: DispatchSession[Forward, Relayed] | None = None
        self._in_flight = 0
        self.metrics.count_in_flight(lambda: self._in_flight)
        self._affinity_header = self.config.affinity_header.lower()
        self._routes: dict[str, tuple[str, Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]]] = {
            **{path: ("POST", self._generation) for path in _ROUTES},
            "/v1/models": ("GET", self._models),
            "/healthz": ("GET", self._healthz),
            "/readyz": ("GET", self._readyz),
            "/metrics": ("GET", self._metrics),
        }

    async def __aenter__(self) -> Router:
        await self.dispatcher.__aenter__()
        self._client = shard_session(
            connect_timeout=self.config.connect_timeout_seconds, read_timeout=self.config.read_timeout_seconds
        )
        self._requests = self._open_session()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._requests is not None:
            await self._requests.aclose()
            self._requests = None
        await self.dispatcher.aclose()
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def ready(self) -> bool:
        """Whether a request would find a shard now."""
        return bool(self.dispatcher.routable)

    # -- the one path to the dispatcher ---------------------------------------------------------------------------

    def _open_session(self) -> DispatchSession[Forward, Relayed]:
        """Independent requests (never a training step's drops) whose run-terminal errors answer that request only.

        Each submission gets the session's next prompt id: the dispatcher's blame evidence is keyed by prompt id,
        and shared ids would pool unrelated requests' failures (two 503s on two shards read as one poison prompt)
        and hide a sick shard (its failures would never be on two distinct prompts)."""
        return self.dispatcher.session(self._attempt, drop_rules=False, on_prompt_error="fail_prompt")

    async def route(self, forward: Forward) -> Outcome[Forward, Relayed]:
        """Run one request through the dispatcher; its outcome (raises the run-terminal error found on it).

        The one place the router talks to the dispatcher: a submission to the router's long-lived session, so
        every request shares its selection, ejection, blame evidence, weights gating, metrics and workers (no
        per-request queues or tasks). A stream's attempt hands the client its bytes itself; once the first one is
        out, the request refuses any retry (:attr:`Forward.retry_refused`), so its outcome follows at once.
        """
        session = self._requests
        assert session is not None, "use the Router as `async with Router(...)`"
        if not session.active:  # ended by an error no request caused (a bug): keep serving on a fresh session
            log.error("the router's dispatch session ended (%s); opening a new one", session.error)
            session = self._requests = self._open_session()
        return await session.submit(forward)

    async def _attempt(self, shard: Shard, forward: Forward) -> Relayed:
        """One attempt on ``shard``. The dispatcher calls it once the shard has room (``dispatch/gate.py``: each
        shard's room learned from its busy answers, the requests past it queued) and hands the room back with its
        answer: the router's backpressure is the dispatcher's."""
        assert self._client is not None, "use the Router as `async with Router(...)`"
        return await forward_attempt(self._client, shard, forward, max_response_bytes=self.config.max_response_bytes)

    # -- HTTP ----------------------------------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every request the router serves (:func:`serve_router` hands them here): the route's answer, counted and
        timed for the API routes, refusals included (by status code)."""
        route = self._routes.get(request.path)
        if route is None:
            return error_response(404, "not_found", f"no route {request.path}")
        method, handler = route
        if request.method != method:
            return error_response(405, "method_not_allowed", f"{request.path} takes {method}", {"Allow": method})
        if request.path not in _MEASURED:
            return await handler(request)
        started = time.perf_counter()
        code = 499  # the client went away before the answer was complete
        try:
            answer = await handler(request)
            code = answer.status
            return answer
        finally:
            self.metrics.answered(request.path, code, time.perf_counter() - started)

    async def _healthz(self, request: web.BaseRequest) -> web.Response:
        return json_response({"status": "ok"})

    async def _readyz(self, request: web.BaseRequest) -> web.Response:
        routable = self.dispatcher.routable
        if routable:
            return json_response({"status": "ready", "routable": len(routable)})
        return json_response({"status": "no_healthy_shard", "reason": self._no_shard_reason()}, 503)

    async def _metrics(self, request: web.BaseRequest) -> web.Response:
        body, content_type = scrape(self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _models(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._answer(Forward("GET", "/v1/models"))

    def _no_shard_reason(self) -> str:
        snapshot = self.dispatcher.snapshot
        if snapshot is None:
            return "the shard source has not reported a healthy set yet"
        if not snapshot.shards:
            return "the shard source reports no healthy shard"
        return f"all {len(snapshot.shards)} healthy shard(s) are ejected"

    def _refuse(self, reason: str, response: web.Response) -> web.Response:
        self.metrics.refused(reason)
        return response

    def _no_healthy_shard(self) -> web.Response:
        """The 409 (see the module docstring), with why nothing is routable."""
        message = f"no healthy shard: {self._no_shard_reason()}"
        return self._refuse("no_healthy_shard", error_response(409, "no_healthy_shard", message))

    async def _generation(self, request: web.BaseRequest) -> web.StreamResponse:
        if self._in_flight >= self.config.max_concurrency:
            retry = {"Retry-After": str(self.config.retry_after_seconds)}
            message = f"the router has {self.config.max_concurrency} requests in flight; retry later"
            return self._refuse("busy", error_response(429, "busy", message, retry))
        limit = self.config.max_body_bytes
        body = await read_body(request, limit)
        if body is None:
            refusal = error_response(413, "request_too_large", f"the body exceeds {limit} bytes")
            refusal.force_close()  # the rest of the body is never read
            return self._refuse("too_large", refusal)
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return self._refuse(
                "malformed", error_response(400, "invalid_request_error", f"the body is not JSON: {exc}")
            )
        if not isinstance(payload, dict):
            return self._refuse(
                "malformed", error_response(400, "invalid_request_error", "the body must be a JSON object")
            )
        affinity = request.headers.get(self._affinity_header) or payload.get("user")
        forward = Forward("POST", request.path, body, affinity if isinstance(affinity, str) else None)
        stream: list[web.StreamResponse] = []
        if payload.get("stream") is True:
            forward.relay = StreamRelay(self._opener(request, stream))
        return await self._answer(forward, stream)

    def _opener(self, request: web.BaseRequest, opened: list[web.StreamResponse]) -> Opener:
        """Opens the client's stream (kept in ``opened``) for the shard whose first byte arrived."""

        async def open_stream(
            shard: Shard, passed: Mapping[str, str], attempt: int
        ) -> Callable[[bytes], Awaitable[None]]:
            weights = self.dispatcher.weights_version(shard.name)
            headers = {**_SSE_HEADERS, **passed, **_shard_headers(shard, attempt, weights)}
            response = web.StreamResponse(headers=headers)
            opened.append(response)
            await self.open_stream(request, response)
            return response.write

        return open_stream

    async def open_stream(self, request: web.BaseRequest, response: web.StreamResponse) -> None:
        """Send a stream's head to the client (a test's seam for a failure once the head is out)."""
        await open_stream(request, response)

    async def _answer(self, forward: Forward, stream: list[web.StreamResponse] | None = None) -> web.StreamResponse:
        if not self.dispatcher.routable:
            return self._no_healthy_shard()
        self._in_flight += 1
        try:
            outcome: Outcome[Forward, Relayed] | Exception
            try:
                outcome = await self.route(forward)
            except Exception as exc:  # the run-terminal error found on this request (or the session's end)
                outcome = exc
            return await self._respond(forward, outcome, stream[0] if stream else None)
        finally:
            self._in_flight -= 1

    async def _respond(
        self, forward: Forward, outcome: Outcome[Forward, Relayed] | Exception, stream: web.StreamResponse | None
    ) -> web.StreamResponse:
        relay = forward.relay
        if relay is not None and stream is not None:  # committed: the client has the headers, never a 2nd reply
            if relay.interrupted is not None:
                shard = relay.committed_to.name if relay.committed_to is not None else "unknown"
                self.metrics.interrupted()
                log.warning("stream from shard %s interrupted: %s", shard, relay.interrupted)
                with contextlib.suppress(ConnectionError):
                    await stream.write(stream_error_event(relay.interrupted, shard))
            return stream  # aiohttp ends it
        if isinstance(outcome, Exception):
            if forward.rejected is not None:  # a shard's own 4xx, judged fleet-wide (every shard says so): relay it
                return self._relay_rejected(forward.rejected, forward.attempts, None)
            return self._failed(outcome)
        if isinstance(outcome, Completed):
            result = outcome.result
            headers = {**result.headers, **_shard_headers(result.shard, outcome.attempts, outcome.weights_version)}
            return web.Response(status=result.status, body=result.body, headers=headers)
        if isinstance(outcome, DataFailed):
            if forward.rejected is not None:
                last = outcome.shards[-1] if outcome.shards else None
                return self._relay_rejected(forward.rejected, outcome.attempts, last)
            return error_response(502, "upstream_error", outcome.reason, shards=list(outcome.shards))
        if isinstance(outcome, Skipped):
            if outcome.failure_type == "NoHealthyShards":
                return self._no_healthy_shard()
            status = 504 if outcome.failure_type == "RolloutTimeout" else 502
            message = f"{outcome.attempts} attempt(s) failed; last: {outcome.reason}"
            return error_response(status, "upstream_unavailable", message, shards=list(outcome.shards))
        return error_response(502, "upstream_unavailable", "the request ended without an answer")

    def _relay_rejected(self, rejected: ShardRejected, attempts: int, shard: str | None) -> web.Response:
        """A shard's 4xx, as it came: the request's fault (or the fleet's, say a wrong key), never retried."""
        headers = {"Content-Type": rejected.content_type, ATTEMPTS_HEADER: str(attempts)}
        if shard is not None:
            headers[SHARD_HEADER] = shard
        return web.Response(status=rejected.status or 400, body=rejected.body, headers=headers)

    def _failed(self, error: Exception) -> web.Response:
        """The answer to a request the dispatcher ended with a run-terminal error (it stays on this request)."""
        if isinstance(error.__cause__, NoHealthyShards):  # no routable shard for a whole healthy wait
            return self._no_healthy_shard()
        if isinstance(error, RolloutFleetMisconfigured):
            return error_response(502, "fleet_misconfigured", str(error))
        if isinstance(error, SessionClosed):
            return error_response(503, "shutting_down", "the router is shutting down")
        log.error("request failed in the dispatcher: %s: %s", type(error).__name__, error)
        return error_response(500, "router_error", f"{type(error).__name__}: {error}")


@dataclass(frozen=True, slots=True)
class RouterServer:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextlib.asynccontextmanager
async def serve_router(router: Router, *, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[RouterServer]:
    """Serve ``router`` (already entered) on ``host:port`` (0: any free port) while the context is open (see
    :mod:`rollout_runtime.router.http`)."""
    async with serve(router.handle, host=host, port=port) as bound:
        yield RouterServer(host=host, port=bound)
