"""HTTP edges of an environment server: bounded JSON bodies and JSON errors without stack traces.

Whatever goes wrong with a request, the caller gets a 4xx/5xx with ``{"error": {"status", "code", "message"}}``
and the server keeps serving; tracebacks go to the server's log only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

__all__ = ["RequestRejected", "error_response", "json_errors_middleware", "read_json_body", "validation_rejection"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RequestRejected(Exception):
    """The request itself is unacceptable; becomes a JSON error response with ``status``."""

    def __init__(self, status: int, code: str, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details


def error_response(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None) -> web.Response:
    error: dict[str, Any] = {"status": status, "code": code, "message": message}
    if details:
        error["details"] = details
    return web.json_response({"error": error}, status=status)


@web.middleware
async def json_errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every error into a JSON error response; never let a traceback reach the caller."""
    try:
        return await handler(request)
    except RequestRejected as exc:
        return error_response(exc.status, exc.code, exc.message, exc.details)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = re.sub(r"[^a-z0-9]+", "_", (exc.reason or "error").lower()).strip("_")
        return error_response(exc.status, code, exc.reason or "error")
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return error_response(500, "internal_error", "internal error; the server log has the details")


async def read_json_body(request: web.Request, limit: int) -> Any:
    """Read at most ``limit`` bytes of JSON; 413 beyond it, 400 for anything that is not JSON Python can parse."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise RequestRejected(413, "request_too_large", f"request body of {declared} bytes exceeds {limit} bytes")
    body = bytearray()
    while chunk := await request.content.read(64 * 1024):
        body += chunk
        if len(body) > limit:
            raise RequestRejected(413, "request_too_large", f"request body exceeds {limit} bytes")
    if not body:
        raise RequestRejected(400, "empty_body", "the request body is empty; send a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise RequestRejected(400, "malformed_json", "the request body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise RequestRejected(400, "malformed_json", f"the request body is not valid JSON: {exc}") from None
    except ValueError as exc:  # valid JSON Python refuses to parse: an integer beyond int's max string digits
        reason = str(exc).split(";", 1)[0]
        message = f"the request body holds a value that cannot be parsed: {reason}"
        raise RequestRejected(400, "malformed_json", message) from None
    except RecursionError:  # json's C scanner recurses per nesting level: a small body can be deep enough
        raise RequestRejected(400, "malformed_json", "the request body is nested too deeply") from None


def validation_rejection(exc: ValidationError, *, max_details: int = 20) -> RequestRejected:
    """422 naming each wrong field and why, without echoing the input back."""
    details = [
        {"loc": [str(part) for part in error["loc"]], "msg": error["msg"], "type": error["type"]}
        for error in exc.errors(include_url=False, include_input=False, include_context=False)[:max_details]
    ]
    return RequestRejected(
        422, "invalid_request", f"the request does not match the episode schema ({exc.error_count()} error(s))", details
    )
