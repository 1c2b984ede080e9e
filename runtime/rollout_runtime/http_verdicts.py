"""One reading of an HTTP answer, whichever client received it: a status (and body) in, a first verdict out.

``GenerationClient`` calls it for its own responses; the status's class is the runtime's one decision,
:func:`rollout_runtime.failures.http_status_is_infra`, which also reads an aiohttp ``ClientResponseError``, an httpx
``HTTPStatusError`` or an openai ``APIStatusError``, the router's and the environment client's answers, so the same
answer gets the same verdict through every client. The verdict is per attempt; the dispatcher's blame
(``dispatch/blame.py``) then weighs the evidence across prompts and shards. The first verdicts, and why:

==========================  =======  ===========================================================================
status                      verdict  why
==========================  =======  ===========================================================================
2xx, not a completion       INFRA    the shard answered something that is not a completion (an HTML page, an error
                                     object, ``choices: []``): a sane shard would not, whatever the prompt
408, 425, 5xx               INFRA    the endpoint is unwell (http_status_is_infra)
429, 503 with Retry-After   INFRA    backpressure: the shard is busy, not broken; go elsewhere, no ejection
401, 403, 407               DATA     credentials: the shard's or the trainer's configuration, never the prompt's,
                                     but one answer cannot tell which; blame can: one shard answering it while
                                     others serve is a sick shard (ejected, its data charges refunded), every shard
                                     answering it is :class:`~rollout_runtime.failures.RolloutFleetMisconfigured`
404                         DATA     "The model `x` does not exist." (this shard serves another model) or no such
                                     path (not an OpenAI API): weighed by blame like the credentials
400, 413, 422, other 4xx    DATA     the request (this prompt: too long, too large, invalid) is what the server
                                     refused; confirmed on a second shard, or re-read as the shard's by evidence
3xx, 1xx                    DATA     a protocol mismatch no other shard fixes (a redirect is reported by the client)
==========================  =======  ===========================================================================

Nothing here imports the taxonomy at module level (the taxonomy imports this): :func:`verdict` asks it for the
status's class, :func:`failure_for` builds the exception.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from rollout_runtime.failures import RolloutFailure

__all__ = [
    "SHARD_OR_FLEET",
    "HttpVerdict",
    "completion_problem",
    "engine_dead",
    "failure_for",
    "is_backpressure",
    "model_missing",
    "not_a_completion",
    "retry_after_seconds",
    "server_message",
    "verdict",
]

Kind = Literal[
    "backpressure",
    "model_missing",
    "shard_or_fleet",
    "invalid_request",
    "server_error",
    "not_a_completion",
    "protocol",
]

SHARD_OR_FLEET: Final[frozenset[int]] = frozenset({401, 403, 404, 407})
"""Answers that say "this shard or this fleet is wrong": a rejected key (the proxy's, 407), a model or a path the shard
does not serve. DATA by the first verdict like any 4xx, but never the prompt's: the dispatcher's blame weighs whose
(one sick shard, or a misconfigured fleet)."""
_MODEL_MISSING: Final[re.Pattern[str]] = re.compile(
    r"model [`'\"]?.*[`'\"]? does not exist|model .*not found|no such model|unknown model", re.IGNORECASE
)
_ENGINE_DEAD: Final[re.Pattern[str]] = re.compile(r"EngineCore encountered an issue", re.IGNORECASE)
"""vLLM's ``EngineDeadError`` message (``vllm/v1/engine/exceptions.py``), in the 500 it answers once its engine
process died."""
_MAX_RETRY_AFTER_SECONDS: Final[float] = 3600.0
"""A Retry-After beyond an hour is a broken header, not advice: capped."""


@dataclass(frozen=True, slots=True)
class HttpVerdict:
    """The first verdict on one HTTP answer."""

    infra: bool
    kind: Kind
    status: int
    message: str
    retry_after: float | None = None


def model_missing(status: int, message: str) -> bool:
    """vLLM's (and others') 404 "The model `x` does not exist.": the shard serves another model."""
    return status == 404 and bool(_MODEL_MISSING.search(message))


def engine_dead(status: int, message: str) -> bool:
    """vLLM's "EngineCore encountered an issue": its engine core process died (vLLM documents the error as global and
    unrecoverable; the server exits within seconds). A 500, or, in a stream that had begun, the same error object as
    an event after the 200. Nothing a prompt did, and nothing more can succeed on that server: the shard's fault at
    once, not an answer that waits for evidence (``dispatch/blame.py``)."""
    return status in (200, 500) and bool(_ENGINE_DEAD.search(message))


def is_backpressure(status: int | None, retry_after: float | None) -> bool:
    """429, or 503 with a Retry-After: "busy", not "broken"."""
    return status == 429 or (status == 503 and retry_after is not None)


def verdict(status: int, message: str = "", retry_after: float | None = None) -> HttpVerdict:
    """The first verdict of an error status (:func:`~rollout_runtime.failures.http_status_is_infra`), with its kind
    (what the failure's message says)."""
    from rollout_runtime.failures import http_status_is_infra

    infra = http_status_is_infra(status)
    kind: Kind
    if is_backpressure(status, retry_after):
        kind = "backpressure"
    elif model_missing(status, message):
        kind = "model_missing"
    elif status in SHARD_OR_FLEET:
        kind = "shard_or_fleet"
    elif infra:
        kind = "server_error"
    elif 400 <= status < 500:
        kind = "invalid_request"
    else:
        kind = "protocol"
    return HttpVerdict(infra, kind, status, message, retry_after)


def retry_after_seconds(headers: Mapping[str, str] | Any, *, now: float | None = None) -> float | None:
    """The Retry-After header as seconds from now (delta-seconds or an HTTP date), None when absent or unreadable."""
    try:
        value = headers.get("Retry-After") if headers is not None else None
    except Exception:
        return None
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_SECONDS)


def server_message(body: bytes) -> str:
    """The error message from an OpenAI/vLLM error body (``message`` or ``error.message``), else the raw text."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return body.decode("utf-8", errors="replace").strip()
    if isinstance(payload, dict):
        error = payload.get("error")
        for holder in (payload, error if isinstance(error, dict) else {}):
            message = holder.get("message")
            if isinstance(message, str):
                return message
        if isinstance(error, str):
            return error
    return body.decode("utf-8", errors="replace").strip()


def completion_problem(payload: Any, *, chat: bool) -> str | None:
    """Why a decoded 200 body is not a completion (None when it is one): the one check every reader shares."""
    if not isinstance(payload, dict):
        return f"the body is a JSON {type(payload).__name__}, not an object"
    error = payload.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        return f"an error object inside a 200: {message}"
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no choices" if choices == [] or choices is None else "choices is not a list"
    choice = choices[0]
    if not isinstance(choice, dict):
        return "the first choice is not an object"
    if chat:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
        if text is None and isinstance(message, dict) and message.get("tool_calls"):
            return None  # an answer that is only a tool call has no content
    else:
        text = choice.get("text")
    if not isinstance(text, str):
        return "the completion text is not a string"
    return None


def failure_for(found: HttpVerdict, where: str) -> RolloutFailure:
    """The taxonomy exception for a verdict: GenerationUnavailable (infra) or RolloutDataFailure, carrying the status
    and the Retry-After, with the server's own message (a data failure's message is the ledger's reason; one about
    the shard or the fleet, such as a 401, also names the shard that gave it)."""
    from rollout_runtime.failures import GenerationUnavailable, RolloutDataFailure

    if found.kind == "model_missing":
        text = f"{where} does not serve the model: {found.message}"
    elif found.kind == "not_a_completion":
        text = f"{where} returned {found.status} with a body that is not a completion: {found.message}"
    elif found.infra or found.kind == "shard_or_fleet":
        text = f"{where} answered HTTP {found.status}: {found.message}"
    else:
        text = found.message
    failure = GenerationUnavailable if found.infra else RolloutDataFailure
    return failure(text, status=found.status, retry_after=found.retry_after)


def not_a_completion(status: int, problem: str) -> HttpVerdict:
    """The verdict on a 2xx whose body is not a completion."""
    return HttpVerdict(True, "not_a_completion", status, problem)
