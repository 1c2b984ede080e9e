"""Whether a failed call to another server (a dependency) is worth another episode attempt.

An environment server calls others: a generation shard, a tool sandbox, a judge. When one of those calls fails the
episode fails, and the reply must say whether another attempt could succeed. The status decision is the runtime's
own: ``is_retryable_dependency_status`` calls :func:`rollout_runtime.failures.http_status_is_infra`, the one
decision about statuses, so the environment side and the generation side can never drift apart (upstream, one of
two copies of the table lacked 425). This side's table keeps upstream's name, ``_RETRYABLE_CLIENT_ERROR_STATUSES``,
and is read off that decision rather than copied from it.
"""

from __future__ import annotations

from typing import Final

import aiohttp

from rollout_runtime.failures import (
    MAX_MESSAGE_CHARS,
    FailureClass,
    classify_rollout_failure,
    exception_text,
    http_status_is_infra,
)
from rollout_runtime.redaction import safe_message

__all__ = [
    "MAX_FAILURE_REASON_CHARS",
    "DependencyResponseError",
    "bound_reason",
    "format_exception_with_response_body",
    "is_retryable_dependency_error",
    "is_retryable_dependency_status",
    "raise_for_dependency_status",
]

_RETRYABLE_CLIENT_ERROR_STATUSES: Final[frozenset[int]] = frozenset(
    s for s in range(400, 500) if http_status_is_infra(s)
)
"""The 4xx statuses worth another episode attempt (408, 425, 429): every other 4xx is terminal, every 5xx retried."""

MAX_FAILURE_REASON_CHARS: Final[int] = MAX_MESSAGE_CHARS
"""A failure reason's bound (2000): enough for a dependency's explanation, too small to ship a whole page."""

_MAX_BODY_BYTES: Final[int] = 64 * 1024
"""How much of a failed dependency's response body is read to explain the failure."""


def is_retryable_dependency_status(status: int) -> bool:
    """Return whether an HTTP error status from another server is worth another episode attempt.

    408, 425, 429 (``_RETRYABLE_CLIENT_ERROR_STATUSES``) and every 5xx are retried; every other 4xx is terminal. The
    decision is :func:`rollout_runtime.failures.http_status_is_infra`, a bool for every int.
    """
    return http_status_is_infra(status)


def is_retryable_dependency_error(error: BaseException) -> bool:
    """Return whether a failed call to another server is worth another episode attempt.

    An HTTP error is classified by its status (see :func:`is_retryable_dependency_status`). A refused or dropped
    connection and a timeout are transient. Any other error, such as a reply that fails validation, would fail the
    same way again. This is the runtime's INFRA/DATA classification, so both sides agree on every error too; an HTTP
    error is judged by its status alone (:func:`is_retryable_dependency_status`), whatever it wraps.
    """
    status = getattr(error, "status", None)
    if isinstance(error, aiohttp.ClientResponseError) and isinstance(status, int) and 100 <= status <= 599:
        return is_retryable_dependency_status(status)
    return classify_rollout_failure(error) is FailureClass.INFRA


class DependencyResponseError(aiohttp.ClientResponseError):
    """A dependency answered with an error status; ``body`` keeps (a bounded prefix of) its own explanation."""

    def __init__(self, response: aiohttp.ClientResponse, body: str) -> None:
        super().__init__(
            response.request_info,
            response.history,
            status=response.status,
            message=response.reason or "",
            headers=None,  # headers are unpicklable and say nothing the body does not
        )
        self.body = body


async def raise_for_dependency_status(response: aiohttp.ClientResponse) -> None:
    """Like ``raise_for_status``, but keep the dependency's explanation from its response body."""
    if response.status < 400:
        return
    raw = await response.content.read(_MAX_BODY_BYTES)
    raise DependencyResponseError(response, raw.decode("utf-8", errors="replace"))


def format_exception_with_response_body(error: BaseException, body: str | None = None) -> str:
    """Describe an error together with the failed response's body, if there was one.

    ``body`` defaults to the error's own ``body`` attribute (see :class:`DependencyResponseError`).
    """
    text = _describe(error)
    if body is None:
        found = getattr(error, "body", None)
        body = found if isinstance(found, str) else None
    if body and body.strip() and body.strip() not in text:
        text = f"{text}: {body.strip()}"
    return text


def bound_reason(text: str, limit: int = MAX_FAILURE_REASON_CHARS) -> str:
    """Bound a failure reason to ``limit`` characters, marking the cut; credentials are redacted first (a
    dependency's error body may echo an API key or an Authorization header)."""
    return safe_message(text, limit)


def _describe(error: BaseException) -> str:
    """An HTTP error as "HTTP 503 Service Unavailable from <url>"; anything else by its message (or class)."""
    if isinstance(error, aiohttp.ClientResponseError):
        url = getattr(getattr(error, "request_info", None), "real_url", None)
        text = f"HTTP {error.status} {error.message}".strip()
        return f"{text} from {url}" if url else text
    return exception_text(error).strip() or type(error).__name__
