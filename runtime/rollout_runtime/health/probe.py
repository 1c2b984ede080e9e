"""Active HTTP probes of OpenAI-compatible generation shards and environment servers.

One probe: GET the health path; for a generation shard with an expected model, also GET ``/v1/models`` and check
the model is listed; with ``ProbeSettings.generate``, also POST a 1-token completion (vLLM's ``/health`` answers
200 while its engine is frozen: only a generation proves the engine works). The prober never raises (cancellation
aside): every failure becomes a :class:`~rollout_runtime.health.hysteresis.ProbeResult` with a bounded reason
label, so a probe loop cannot die of a strange response. Defences, because the URL may come from a custom resource
anyone with RBAC can write:

- the target policy is checked before connecting, and every address a name resolves to is checked again;
- no redirects are followed (a 3xx is a failure), no proxies from the environment, no cookies, no decompression;
- response bodies are read up to ``max_body_bytes`` (64 KiB), never more;
- one deadline (``timeout_seconds``) bounds the whole probe, connect included.

Connections are not kept alive between probes: each probe opens a fresh one, so a shard that stopped accepting
work is seen as such, and a restarted shard is never judged by a dead pooled socket.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from typing import Any, Final, Protocol

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from rollout_runtime.health.hysteresis import ProbeReason, ProbeResult, ProbeSettings
from rollout_runtime.health.targets import ForbiddenProbeTarget, ProbeTargetPolicy
from rollout_runtime.redaction import redact_secrets, redirect_message, safe_message

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "GENERATE_PATH",
    "MODELS_PATH",
    "HttpProber",
    "Prober",
    "check_completion",
    "check_model_list",
    "status_hint",
]

DEFAULT_MAX_BODY_BYTES: Final[int] = 64 * 1024
MODELS_PATH: Final[str] = "/v1/models"
GENERATE_PATH: Final[str] = "/v1/completions"
GENERATE_PROMPT: Final[str] = "1"
"""The generate probe's prompt: one token on any tokenizer, so the probe costs one prefill and one decode step."""
_MAX_LISTED_MODELS_IN_MESSAGE: Final[int] = 5


class Prober(Protocol):
    """Anything that probes an endpoint and always returns a result (the HTTP prober, or a fake in tests)."""

    async def probe(
        self, endpoint: str, settings: ProbeSettings, *, expected_model: str | None = None
    ) -> ProbeResult: ...


class _Failed(Exception):
    """Internal: a probe step failed with a reason; turned into a ProbeResult at the edge."""

    def __init__(self, reason: ProbeReason, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


class _ForbiddenAddress(OSError):
    """Raised by the resolver for a name that resolves to a refused address (aiohttp wraps OSErrors)."""


class _PolicyResolver(AbstractResolver):
    """Resolves names with aiohttp's default resolver, then refuses the name if any address is not permitted.

    Permitted is :meth:`ProbeTargetPolicy.check_resolved` (forbidden ranges, loopback, and the CIDR allowlist);
    aiohttp connects to exactly the addresses returned here, so there is no second resolution to race.

    Refusing (rather than filtering) is deliberate: a name that mixes a metadata address into its answers is
    hostile, and half-trusting it would make the probe outcome depend on address order.
    """

    def __init__(self, policy: ProbeTargetPolicy) -> None:
        self._policy = policy
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            verdict = self._policy.check_resolved(host, result["host"])
            if not verdict.allowed:
                raise _ForbiddenAddress(f"{host} resolves to a refused address: {verdict.reason}")
        return results

    async def close(self) -> None:
        await self._inner.close()


def status_hint(url: str, status: int, settings: ProbeSettings) -> str:
    """What to change when a probe path answers 404/405: the message must say how to fix it, not only that it
    failed (a shard that never becomes healthy is otherwise a mystery)."""
    if status not in (404, 405):
        return ""
    if url.endswith(MODELS_PATH) and settings.path != MODELS_PATH:
        return ": the server has no /v1/models; set probe.check_model to false (ProbeSettings(check_model=False))"
    return f": set probe.path to the server's health endpoint (ProbeSettings(path=...); now {settings.path!r})"


def check_model_list(body: bytes, expected_model: str) -> tuple[ProbeReason, str] | None:
    """Check an OpenAI ``/v1/models`` body lists ``expected_model``; return (reason, message) on failure.

    Pure and total: any byte string gives an answer, never an exception (the body comes from the network).
    """
    try:
        payload: Any = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return ProbeReason.MALFORMED, f"/v1/models is not JSON: {type(exc).__name__}"
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        return ProbeReason.MALFORMED, "/v1/models is not an OpenAI model list (no 'data' array)"
    served: list[str] = []
    for entry in payload["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            return ProbeReason.MALFORMED, "/v1/models has an entry without a string 'id'"
        served.append(entry["id"])
    if expected_model in served:
        return None
    shown = ", ".join(repr(s[:100]) for s in served[:_MAX_LISTED_MODELS_IN_MESSAGE])
    more = (
        f" and {len(served) - _MAX_LISTED_MODELS_IN_MESSAGE} more"
        if len(served) > _MAX_LISTED_MODELS_IN_MESSAGE
        else ""
    )
    listing = f"[{shown}{more}]" if served else "no models"
    return ProbeReason.WRONG_MODEL, f"expected model {expected_model[:200]!r} but the shard serves {listing}"


def check_completion(body: bytes) -> tuple[ProbeReason, str] | None:
    """Check a generate probe's answer is an OpenAI completion with a choice; return (reason, message) if not.

    Pure and total, like :func:`check_model_list`.
    """
    try:
        payload: Any = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return ProbeReason.MALFORMED, f"{GENERATE_PATH} is not JSON: {type(exc).__name__}"
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ProbeReason.MALFORMED, f"{GENERATE_PATH} answered 200 without a choice"
    return None


class HttpProber:
    """Probes endpoints over HTTP with one shared ClientSession (created on first use, closed by :meth:`close`)."""

    def __init__(
        self,
        policy: ProbeTargetPolicy | None = None,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        user_agent: str = "rollout-fleet-prober",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        self.policy = policy if policy is not None else ProbeTargetPolicy()
        self.max_body_bytes = max_body_bytes
        self._user_agent = user_agent
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        """https targets are verified: against the system CAs, or ``ssl_context`` (e.g. a cluster CA bundle)."""
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HttpProber:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(resolver=_PolicyResolver(self.policy), force_close=True, limit=64)
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                headers={"User-Agent": self._user_agent, "Accept-Encoding": "identity"},
            )
        return self._session

    async def probe(self, endpoint: str, settings: ProbeSettings, *, expected_model: str | None = None) -> ProbeResult:
        """Probe ``endpoint`` (a base URL); check ``/v1/models`` lists ``expected_model`` if given. Never raises."""
        start = time.monotonic()
        status: int | None = None
        step = "answer"
        try:
            base = endpoint.rstrip("/")
            health_url = base + settings.path
            self.policy.require(health_url)
            async with asyncio.timeout(settings.timeout_seconds):
                status, _ = await self._get(health_url, settings)
                if expected_model:
                    status, body = await self._get(base + MODELS_PATH, settings)
                    problem = check_model_list(body, expected_model)
                    if problem is not None:
                        raise _Failed(problem[0], problem[1], status)
                if settings.generate:
                    step = "generation"
                    status, body = await self._generate(base + GENERATE_PATH, settings, expected_model)
                    problem = check_completion(body)
                    if problem is not None:
                        raise _Failed(problem[0], problem[1], status)
        except _Failed as failed:
            return self._failure(failed.reason, str(failed), start, failed.status)
        except ForbiddenProbeTarget as exc:
            return self._failure(ProbeReason.FORBIDDEN_TARGET, str(exc), start, None)
        except TimeoutError:  # asyncio.timeout, and aiohttp's timeout errors (they subclass TimeoutError)
            message = f"no {step} within {settings.timeout_seconds:g} s"
            return self._failure(ProbeReason.TIMEOUT, message, start, status)
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, _ForbiddenAddress):
                return self._failure(ProbeReason.FORBIDDEN_TARGET, str(exc.os_error), start, None)
            return self._failure(ProbeReason.CONNECT, f"cannot connect: {exc}", start, None)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as exc:
            return self._failure(ProbeReason.CONNECT, f"connection lost: {type(exc).__name__}: {exc}", start, status)
        except aiohttp.ClientResponseError as exc:  # an unparseable HTTP response
            return self._failure(ProbeReason.MALFORMED, f"invalid HTTP response: {exc.message}", start, status)
        except Exception as exc:  # never let a probe loop die of a surprise; the message names it
            return self._failure(ProbeReason.ERROR, f"{type(exc).__name__}: {exc}", start, status)
        return ProbeResult.success(latency_seconds=time.monotonic() - start, status=status, at=time.time())

    async def _get(self, url: str, settings: ProbeSettings) -> tuple[int, bytes]:
        """GET with redirects off; non-2xx and oversized bodies raise _Failed."""
        return await self._request("GET", url, settings, None)

    async def _generate(self, url: str, settings: ProbeSettings, model: str | None) -> tuple[int, bytes]:
        """POST the 1-token completion (greedy; the model named when known, else the server's default)."""
        payload: dict[str, Any] = {"prompt": GENERATE_PROMPT, "max_tokens": 1, "temperature": 0}
        if model:
            payload["model"] = model
        return await self._request("POST", url, settings, payload)

    async def _request(
        self, method: str, url: str, settings: ProbeSettings, payload: dict[str, Any] | None
    ) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=settings.timeout_seconds)
        async with self._get_session().request(
            method, url, json=payload, allow_redirects=False, timeout=timeout, ssl=self._ssl
        ) as response:
            status = response.status
            if 300 <= status < 400:
                where = f"{method} {url[:200]}"
                raise _Failed(ProbeReason.REDIRECT, redirect_message(where, status, response.headers), status)
            if not 200 <= status < 300:
                reason = safe_message(response.reason or "", 200)
                message = f"{method} {url[:200]} answered {status} {reason}{status_hint(url, status, settings)}"
                raise _Failed(ProbeReason.STATUS, message, status)
            body = await self._read_bounded(response, url)
            return status, body

    async def _read_bounded(self, response: aiohttp.ClientResponse, url: str) -> bytes:
        limit = self.max_body_bytes
        too_large = _Failed(ProbeReason.TOO_LARGE, f"GET {url[:200]} body exceeds {limit} bytes", response.status)
        if response.content_length is not None and response.content_length > limit:
            raise too_large
        buffer = bytearray()
        async for chunk in response.content.iter_chunked(16 * 1024):
            buffer += chunk
            if len(buffer) > limit:
                raise too_large
        return bytes(buffer)

    @staticmethod
    def _failure(reason: ProbeReason, message: str, start: float, status: int | None) -> ProbeResult:
        # Messages land in statuses, Events and logs; URLs, reason phrases and Locations come from the target.
        return ProbeResult.failure(
            reason, redact_secrets(message), latency_seconds=time.monotonic() - start, status=status, at=time.time()
        )
