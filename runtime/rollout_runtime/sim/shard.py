"""A simulated generation shard: a real aiohttp server speaking the OpenAI-compatible subset vLLM serves.

Endpoints: ``/health``, ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, plus ``/admin/faults``
(GET the faults; POST merges fields, PUT replaces them) and ``/admin/stats``.

Weights, in SGLang's and vLLM's shapes: the shard holds a weights version (``"default"`` at every start, like
SGLang without ``--weight-version``), reported by ``GET /weight_version`` and ``/get_weight_version`` (SGLang) and
``GET /weight_info`` (vLLM dev mode) as ``{"weight_version": ...}``, and on every response as the
``X-Weight-Version`` header (SGLang puts it in each response's ``meta_info``). ``POST /update_weights_from_disk``
(SGLang: ``{"model_path", "weight_version"}`` -> ``{"success", "message"}``) and ``POST /update_weight_version``
(``{"new_version"}``) change it. ``GET /metrics`` exports ``process_start_time_seconds``. A restarted process
is back at ``"default"``: what a crashed server reloading its base checkpoint looks like.

The "model" is deterministic so an environment can verify answers (:func:`expected_answer`): a prompt ending in an
arithmetic question (``What is 12 * 7?``) is answered with the number; ``reverse: a b c`` with ``c b a``; anything
else is echoed. Tokens are whitespace-separated words. ``max_model_len`` is enforced with vLLM's own 400 body.

Faults (:class:`SimFaults`), settable by flags and at run time: hang (accept, never answer, until lifted), slow
(added latency), errors by status (a rate, or a deterministic burst of the next N requests), connection dropped
mid-response (a rate, or the next N), 200s that are not completions (the next N), garbled samples in well-formed
200s (a rate), a concurrency cap answered with
429 and Retry-After, serving the wrong model, an unhealthy ``/health``, flapping, and crash (the process exits at
once, or after N generation requests). Errors are JSON in vLLM's shape; a request never sees a stack trace.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollout_runtime.sim.tokens import choice_token_fields, prompt_logprobs, sse_event, stream_chunks, token_id

__all__ = [
    "READY_PREFIX",
    "SimFaults",
    "SimShardConfig",
    "arithmetic",
    "count_tokens",
    "create_app",
    "expected_answer",
    "flap_is_down",
    "garble",
    "vllm_context_length_message",
]

log = logging.getLogger(__name__)

READY_PREFIX: Final[str] = "SIM_SHARD_READY "
"""The line a sim shard prints on stdout once it listens, followed by JSON: host, port, pid, model."""
CRASH_EXIT_CODE: Final[int] = 3
_MAX_CHOICES: Final[int] = 16
_GARBLE_SYLLABLES: Final[tuple[str, ...]] = ("zq", "xv", "##", "\ufffd", "kj", "<unk>", "ll", "qq")
"""What a garbled sample is made of: nothing the sim model would say, so it is told apart by length and logprobs."""
_ARITHMETIC = re.compile(r"(-?\d{1,12})\s*([-+*])\s*(-?\d{1,12})")


class SimFaults(BaseModel):
    """What is wrong with the shard right now. The default is nothing."""

    model_config = ConfigDict(extra="forbid")

    hang: bool = False
    """Accept requests (also /health) but answer none until the hang is lifted (admin is never hung)."""
    engine_hang: bool = False
    """Generations hang until lifted while ``/health`` and ``/v1/models`` still answer: a frozen vLLM engine core
    (its API server keeps answering ``/health`` 200), which only a generate probe (``probe.generate``) sees."""
    slow_seconds: Annotated[float, Field(ge=0, le=3600)] = 0.0
    """Added latency on generation requests."""
    error_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Fraction of generation requests answered with ``error_status``."""
    error_status: Annotated[int, Field(ge=400, le=599)] = 503
    fail_next: Annotated[int, Field(ge=0)] = 0
    """The next N generation requests fail with ``error_status`` (a deterministic burst)."""
    drop_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Fraction of generation responses cut off mid-body (the connection is closed)."""
    drop_next: Annotated[int, Field(ge=0)] = 0
    """The next N generation responses are cut off mid-body."""
    wrong_model: str | None = None
    """Serve this model name instead of the configured one."""
    unhealthy: bool = False
    """``/health`` answers 503 (the process otherwise works)."""
    flap_seconds: Annotated[float, Field(gt=0, le=3600)] | None = None
    """Flapping: alternate ``flap_seconds`` up and ``flap_seconds`` down (``/health`` and generation answer 503
    while down), starting up when the fault is set."""
    crash: bool = False
    """Exit the process at once (via the admin endpoint: right after answering)."""
    crash_after_requests: Annotated[int, Field(ge=1)] | None = None
    """Exit the process on the Nth generation request from now, without answering it."""
    token_delay_seconds: Annotated[float, Field(ge=0, le=60)] = 0.0
    """Pause between streamed chunks (``stream: true``), so a stream is in progress long enough to be stopped."""
    max_concurrent: Annotated[int, Field(ge=1)] | None = None
    """Generation requests it serves at once; one more is answered 429 with ``Retry-After`` at once (a server that
    caps its concurrency instead of queueing)."""
    busy_retry_after_seconds: Annotated[int, Field(ge=0, le=3600)] = 1
    """The ``Retry-After`` of those 429s."""
    not_a_completion_next: Annotated[int, Field(ge=0)] = 0
    """The next N generation requests are answered 200 with a body that is not a completion (``not_a_completion``);
    a stream's first event is that body, then ``data: [DONE]``."""
    not_a_completion_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Fraction of generation requests answered so, at random (a gray shard: ``/health`` 200, some answers junk)."""
    not_a_completion: Literal["truncated", "no_choices", "error_object", "empty"] = "error_object"
    """What such a 200 carries: JSON cut short, ``"choices": []``, an OpenAI error object, or no body at all."""
    garble_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Fraction of generated samples that are garbage in a well-formed 200: random words up to ``max_tokens``,
    finish reason ``length`` (a gray failure: Z.ai saw 3-5 such outputs per 10,000 requests under load). Only the
    outputs' statistics against the peers' can tell (``dispatch/quality``)."""

    @model_validator(mode="after")
    def _named_model(self) -> SimFaults:
        if self.wrong_model is not None and not self.wrong_model.strip():
            raise ValueError("wrong_model must be a non-empty model name or null")
        return self


class SimShardConfig(BaseModel):
    """How a sim shard is configured at start."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(min_length=1, max_length=256)] = "sim-model"
    max_model_len: Annotated[int, Field(gt=0)] = 4096
    seed: int = 0
    """Seeds the random choices of ``error_rate`` and ``drop_rate``."""
    max_body_bytes: Annotated[int, Field(gt=0)] = 1024 * 1024
    weight_version: Annotated[str, Field(min_length=1, max_length=256)] = "default"
    """The weights version at start (SGLang's ``--weight-version``); every restart comes back at it."""
    faults: SimFaults = Field(default_factory=SimFaults)


FINAL_STATS: Final[str] = "sim shard: final stats "
"""The prefix of the last line a shard writes to its log when it stops, with its counters as JSON."""


def garble(rng: random.Random, words: int) -> str:
    """``words`` words of garbage, as the ``garble_rate`` fault answers (the quality benchmark draws the same)."""
    return " ".join(f"{rng.choice(_GARBLE_SYLLABLES)}{rng.randrange(100)}" for _ in range(words))


def flap_is_down(elapsed_seconds: float, flap_seconds: float) -> bool:
    """Whether a shard flapping since ``elapsed_seconds`` ago is down: ``flap_seconds`` up, then down, and so on."""
    return int(elapsed_seconds / flap_seconds) % 2 == 1


def count_tokens(text: str) -> int:
    """The sim's tokenizer: whitespace-separated words."""
    return len(text.split())


def arithmetic(left: int, op: str, right: int) -> int:
    """``left op right`` for op one of + - * (the sim model and the sim verifier compute answers alike)."""
    return left + right if op == "+" else left - right if op == "-" else left * right


def expected_answer(prompt: str) -> str:
    """The sim model's answer to a prompt (an environment verifier can compute it too).

    - the last ``a op b`` (op one of + - *) in the prompt: the result, e.g. "What is 12 * 7?" -> "84";
    - ``reverse: w1 w2 w3`` -> "w3 w2 w1";
    - otherwise the prompt itself, whitespace-normalised.
    """
    matches = _ARITHMETIC.findall(prompt)
    if matches:
        a, op, b = matches[-1]
        return str(arithmetic(int(a), op, int(b)))
    _, sep, tail = prompt.partition("reverse:")
    if sep:
        return " ".join(reversed(tail.split()))
    return " ".join(prompt.split())


def vllm_context_length_message(max_model_len: int, prompt_tokens: int, max_tokens: int | None) -> str:
    """vLLM's (0.6-0.10 OpenAI server) exact wording when a request exceeds ``max_model_len``."""
    if max_tokens is None:
        return (
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens} tokens in the messages, Please reduce the length of the messages."
        )
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{max_tokens + prompt_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). "
        f"Please reduce the length of the messages or completion."
    )


_ERROR_TYPES: Final[dict[int, str]] = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestEntityTooLargeError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_response(status: int, message: str, *, param: str | None = None) -> web.Response:
    """An error in the shape vLLM's OpenAI server uses (0.32, the pinned one; up to 0.10 the fields were at the top
    level): ``{"error": {"message", "type", "param", "code"}}``."""
    error = {
        "message": message,
        "type": _ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError"),
        "param": param,
        "code": status,
    }
    return web.json_response({"error": error}, status=status)


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _text_of(content: Any) -> str:
    """Chat message content: a string, or OpenAI content parts (text parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    if content is None:
        return ""
    raise _BadRequest("message content must be a string or a list of content parts")


def _int_field(body: dict[str, Any], name: str, default: int | None, *, minimum: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _BadRequest(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_token_options(body: dict[str, Any], *, chat: bool) -> None:
    """The token-level options in vLLM's types, or a 400 that names the field (never a 500 later)."""
    if chat:
        if not isinstance(body.get("logprobs", False), bool | None):
            raise _BadRequest("logprobs must be a boolean on /v1/chat/completions")
        _int_field(body, "top_logprobs", None, minimum=0)
    else:
        _int_field(body, "logprobs", None, minimum=0)
    _int_field(body, "prompt_logprobs", None, minimum=0)
    for name in ("stream", "return_token_ids", "return_tokens_as_token_ids"):
        if not isinstance(body.get(name, False), bool | None):
            raise _BadRequest(f"{name} must be a boolean")
    if not isinstance(body.get("stream_options", {}), dict | None):
        raise _BadRequest("stream_options must be an object")


class SimShard:
    """The server state: config, live faults, counters. :meth:`app` builds the aiohttp application."""

    def __init__(
        self,
        config: SimShardConfig,
        *,
        exit_process: Callable[[int], None] = os._exit,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.faults = config.faults.model_copy()
        self.stats: Counter[str] = Counter()
        self._random = random.Random(config.seed)
        self._unhang = asyncio.Event()
        self._exit_process = exit_process
        self._clock = clock
        self._requests_until_crash = self.faults.crash_after_requests
        self._faults_set_at = self._clock()
        self._generating = 0
        self.weight_version = config.weight_version
        self.started_at = time.time()

    def flapped_down(self) -> bool:
        """Whether a flapping shard is in its down half-period right now."""
        period = self.faults.flap_seconds
        if period is None:
            return False
        return flap_is_down(self._clock() - self._faults_set_at, period)

    @property
    def served_model(self) -> str:
        return self.faults.wrong_model or self.config.model

    def app(self) -> web.Application:
        middlewares = [self._errors_as_json, self._weight_version_header, self._capped]
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=middlewares)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/admin/faults", self._get_faults)
        app.router.add_post("/admin/faults", self._merge_faults)
        app.router.add_put("/admin/faults", self._replace_faults)
        app.router.add_get("/admin/stats", self._get_stats)
        self._add_weights_routes(app)
        return app

    # ------------------------------------------------------------------------------------------ plumbing

    @web.middleware
    async def _errors_as_json(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except _BadRequest as exc:
            self.stats["bad_requests"] += 1
            return error_response(exc.status, str(exc))
        except web.HTTPException as exc:  # 404, 405, 413 from aiohttp itself
            if exc.status < 400:
                raise
            return error_response(exc.status, exc.reason)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("sim shard: unexpected error in %s %s", request.method, request.path)
            return error_response(500, "internal error in the simulated shard")

    @web.middleware
    async def _capped(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """``max_concurrent``: a generation request past the cap is answered 429 at once (counted)."""
        if not request.path.startswith("/v1/") or request.method != "POST":
            return await handler(request)
        cap = self.faults.max_concurrent
        if cap is not None and self._generating >= cap:
            self.stats["errors_429"] += 1
            self.stats["refused_at_cap"] += 1  # never reaches _generation_faults: not in generation_requests
            busy = error_response(429, f"injected fault: {cap} requests in flight")
            busy.headers["Retry-After"] = str(self.faults.busy_retry_after_seconds)
            return busy
        self._generating += 1
        self.stats["max_generating"] = max(self.stats["max_generating"], self._generating)
        try:
            return await handler(request)
        finally:
            self._generating -= 1

    async def _wait_if_hung(self, *, generation: bool = False) -> None:
        while self.faults.hang or (generation and self.faults.engine_hang):
            self.stats["hung"] += 1
            self._unhang.clear()
            await self._unhang.wait()

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()  # bounded by client_max_size (413 beyond it)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise _BadRequest("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest("request body must be a JSON object")
        return body

    def _check_model(self, body: dict[str, Any]) -> None:
        requested = body.get("model")
        if requested is not None and requested != self.served_model:
            raise _BadRequest(f"The model `{str(requested)[:200]}` does not exist.", status=404)

    def _crash(self) -> None:
        log.warning("sim shard: crashing on purpose (exit %d)", CRASH_EXIT_CODE)
        self._exit_process(CRASH_EXIT_CODE)

    async def _generation_faults(self) -> web.Response | None:
        """Apply the faults that hit a generation request before it is answered; return an error to send."""
        self.stats["generation_requests"] += 1
        if self._requests_until_crash is not None:
            self._requests_until_crash -= 1
            if self._requests_until_crash <= 0:
                self._crash()
        await self._wait_if_hung(generation=True)
        if self.flapped_down():
            self.stats["errors_503"] += 1
            return error_response(503, "injected fault: flapping shard is down")
        if self.faults.fail_next > 0 or (self.faults.error_rate and self._random.random() < self.faults.error_rate):
            self.faults.fail_next = max(0, self.faults.fail_next - 1)
            self.stats[f"errors_{self.faults.error_status}"] += 1
            return error_response(self.faults.error_status, f"injected fault: HTTP {self.faults.error_status}")
        if self.faults.slow_seconds:
            self.stats["slowed"] += 1
            await asyncio.sleep(self.faults.slow_seconds)
        return None

    def _not_a_completion(self) -> bytes | None:
        """The body of a 200 that is not a completion, while ``not_a_completion_next`` lasts or at
        ``not_a_completion_rate`` (counted)."""
        if self.faults.not_a_completion_next > 0:
            self.faults.not_a_completion_next -= 1
        elif not (self.faults.not_a_completion_rate and self._random.random() < self.faults.not_a_completion_rate):
            return None
        kind = self.faults.not_a_completion
        self.stats[f"not_a_completion_{kind}"] += 1
        if kind == "truncated":
            return b'{"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "te'
        if kind == "empty":
            return b""
        if kind == "no_choices":
            return json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": []}).encode()
        error = {"message": "injected: an error inside a 200", "type": "InternalServerError"}
        return json.dumps({"error": error}).encode()

    async def _respond(self, request: web.Request, payload: dict[str, Any]) -> web.StreamResponse:
        bad = self._not_a_completion()
        if bad is not None:
            return web.Response(body=bad, content_type="application/json")
        body = json.dumps(payload).encode()
        drop = self.faults.drop_next > 0 or (self.faults.drop_rate and self._random.random() < self.faults.drop_rate)
        if not drop:
            self.stats["completions"] += 1
            return web.Response(body=body, content_type="application/json")
        self.faults.drop_next = max(0, self.faults.drop_next - 1)
        self.stats["dropped"] += 1
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": str(len(body))})
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        if request.transport is not None:
            request.transport.close()
        return response

    # ------------------------------------------------------------------------------------------ endpoints

    async def _health(self, request: web.Request) -> web.StreamResponse:
        await self._wait_if_hung()
        if self.faults.unhealthy or self.flapped_down():
            return web.Response(status=503)
        return web.Response(status=200)  # vLLM answers 200 with an empty body

    async def _models(self, request: web.Request) -> web.StreamResponse:
        await self._wait_if_hung()
        card = {
            "id": self.served_model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.served_model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    def _budget(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """Tokens the completion may use; raises vLLM's context-length error when the request does not fit."""
        limit = self.config.max_model_len
        if (max_tokens is None and prompt_tokens >= limit) or (
            max_tokens is not None and prompt_tokens + max_tokens > limit
        ):
            raise _BadRequest(vllm_context_length_message(limit, prompt_tokens, max_tokens))
        return max_tokens if max_tokens is not None else limit - prompt_tokens

    def _generate(self, prompt: str, budget: int) -> tuple[str, int, str]:
        if self.faults.garble_rate and self._random.random() < self.faults.garble_rate:
            self.stats["garbled"] += 1
            return garble(self._random, budget), budget, "length"
        words = expected_answer(prompt).split()
        finish = "stop" if len(words) <= budget else "length"
        words = words[:budget]
        return " ".join(words), len(words), finish

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        self._check_model(body)
        _check_token_options(body, chat=False)
        raw_prompt = body.get("prompt")
        prompts: list[str]
        if isinstance(raw_prompt, str):
            prompts = [raw_prompt]
        elif isinstance(raw_prompt, list) and raw_prompt and all(isinstance(p, str) for p in raw_prompt):
            prompts = list(raw_prompt)
        elif isinstance(raw_prompt, list) and raw_prompt and all(type(t) is int for t in raw_prompt):
            prompts = [" ".join(str(t) for t in raw_prompt)]
        else:
            raise _BadRequest("prompt must be a string, a list of strings, or a list of token ids")
        max_tokens = _int_field(body, "max_tokens", 16, minimum=1)  # vLLM's completions default is 16
        n = _int_field(body, "n", 1, minimum=1) or 1
        if n > _MAX_CHOICES or len(prompts) > _MAX_CHOICES:
            raise _BadRequest(f"at most {_MAX_CHOICES} prompts and choices per request")
        budgets = [self._budget(count_tokens(p), max_tokens) for p in prompts]
        failure = await self._generation_faults()
        if failure is not None:
            return failure
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        for prompt, budget in zip(prompts, budgets, strict=True):
            prompt_tokens += count_tokens(prompt)
            for _ in range(n):
                text, used, finish = self._generate(prompt, budget)
                completion_tokens += used
                choices.append(
                    {
                        "index": len(choices),
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                    }
                )
                self._add_token_fields(choices[-1], body, text, prompt, chat=False)
        envelope = self._envelope("cmpl", "text_completion", choices, prompt_tokens, completion_tokens)
        if body.get("stream"):
            return await self._stream(request, envelope, body, chat=False)
        return await self._respond(request, envelope)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        self._check_model(body)
        _check_token_options(body, chat=True)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise _BadRequest("messages must be a non-empty list of message objects")
        texts = [_text_of(m.get("content")) for m in messages]
        prompt_tokens = sum(count_tokens(t) for t in texts)
        user_texts = [t for m, t in zip(messages, texts, strict=True) if m.get("role") == "user"]
        max_tokens = _int_field(body, "max_completion_tokens", None, minimum=1)
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", None, minimum=1)
        n = _int_field(body, "n", 1, minimum=1) or 1
        if n > _MAX_CHOICES:
            raise _BadRequest(f"at most {_MAX_CHOICES} choices per request")
        budget = self._budget(prompt_tokens, max_tokens)
        failure = await self._generation_faults()
        if failure is not None:
            return failure
        question = user_texts[-1] if user_texts else texts[-1]
        choices: list[dict[str, Any]] = []
        completion_tokens = 0
        for index in range(n):
            text, used, finish = self._generate(question, budget)
            completion_tokens += used
            choices.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            )
            self._add_token_fields(choices[-1], body, text, None, chat=True)
        envelope = self._envelope("chatcmpl", "chat.completion", choices, prompt_tokens, completion_tokens)
        if body.get("prompt_logprobs") is not None:
            envelope["prompt_logprobs"] = prompt_logprobs(" ".join(texts))
        if body.get("stream"):
            return await self._stream(request, envelope, body, chat=True)
        return await self._respond(request, envelope)

    @staticmethod
    def _add_token_fields(
        choice: dict[str, Any], body: dict[str, Any], text: str, prompt: str | None, *, chat: bool
    ) -> None:
        """Token ids, logprobs and (completions) prompt logprobs, when the request asked for them as vLLM's does."""
        choice.update(choice_token_fields(body, text.split(), chat=chat))
        if prompt is not None and body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = prompt_logprobs(prompt)
        if prompt is not None and body.get("return_token_ids"):  # vLLM 0.32: in each choice of a completion
            choice["prompt_token_ids"] = [token_id(word) for word in prompt.split()]

    async def _stream(
        self, request: web.Request, envelope: dict[str, Any], body: dict[str, Any], *, chat: bool
    ) -> web.StreamResponse:
        """Answer ``stream: true`` as vLLM does: SSE chunks, a usage chunk if asked, ``data: [DONE]``.

        ``token_delay_seconds`` paces the chunks; a drop fault cuts the stream after half of them.
        """
        key = "message" if chat else "text"
        picked = [
            ((c[key]["content"] if chat else c[key]).split(), str(c["finish_reason"])) for c in envelope["choices"]
        ]
        if not chat and body.get("prompt_logprobs") is not None and envelope["choices"]:
            envelope["_prompt_logprobs"] = envelope["choices"][0].get("prompt_logprobs")
        options = body.get("stream_options")
        usage = envelope["usage"] if isinstance(options, dict) and options.get("include_usage") else None
        chunks = list(stream_chunks(envelope, picked, body, chat=chat, usage=usage))
        drop = self.faults.drop_next > 0 or (self.faults.drop_rate and self._random.random() < self.faults.drop_rate)
        if drop:
            self.faults.drop_next = max(0, self.faults.drop_next - 1)
            self.stats["dropped"] += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        bad = self._not_a_completion()
        if bad is not None:
            await response.write(b"data: " + bad + b"\n\n" + sse_event("[DONE]"))
            await response.write_eof()
            return response
        for index, chunk in enumerate(chunks):
            if drop and index >= len(chunks) // 2:
                if request.transport is not None:
                    request.transport.close()
                return response
            await response.write(sse_event(chunk))
            if self.faults.token_delay_seconds:
                await asyncio.sleep(self.faults.token_delay_seconds)
        await response.write(sse_event("[DONE]"))
        self.stats["completions"] += 1
        self.stats["streams"] += 1
        await response.write_eof()
        return response

    def _envelope(
        self, id_prefix: str, kind: str, choices: list[dict[str, Any]], prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        """The OpenAI response around the choices, as vLLM shapes it for both completion endpoints."""
        return {
            "id": f"{id_prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.served_model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    # ------------------------------------------------------------------------------------------ admin

    async def _get_faults(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.faults.model_dump(mode="json"))

    async def _merge_faults(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        return self._apply_faults({**self.faults.model_dump(), **body})

    async def _replace_faults(self, request: web.Request) -> web.StreamResponse:
        return self._apply_faults(await self._json_body(request))

    def _apply_faults(self, fields: dict[str, Any]) -> web.StreamResponse:
        try:
            faults = SimFaults.model_validate(fields)
        except ValidationError as exc:
            errors = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:10])
            raise _BadRequest(f"invalid faults: {errors}") from None
        self.faults = faults
        self._requests_until_crash = faults.crash_after_requests
        self._faults_set_at = self._clock()
        self._unhang.set()  # every waiter re-checks the faults it waits on (hang, engine_hang)
        if faults.crash:
            asyncio.get_running_loop().call_soon(self._crash)  # after this response is written
            return web.json_response({"crashing": True}, status=202)
        return web.json_response(faults.model_dump(mode="json"))

    async def _get_stats(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(dict(self.stats))

    # ------------------------------------------------------------------------------------------ weights

    def _add_weights_routes(self, app: web.Application) -> None:
        app.router.add_get("/weight_version", self._get_weight_version)
        app.router.add_get("/get_weight_version", self._get_weight_version)
        app.router.add_get("/weight_info", self._get_weight_version)
        app.router.add_post("/update_weights_from_disk", self._update_weights_from_disk)
        app.router.add_post("/update_weight_version", self._update_weight_version)
        app.router.add_get("/metrics", self._metrics)
        # vLLM's dev-mode RL endpoints (VLLM_SERVER_DEV_MODE=1), the ones rollout_runtime.weights.vllm_reload_weights
        # uses: pausing parks new generations (mode wait/keep; abort is not simulated), and reload_weights through
        # collective_rpc answers as vLLM does; the weights themselves are the sim's deterministic model.
        app.router.add_post("/pause", self._pause)
        app.router.add_post("/resume", self._resume)
        app.router.add_get("/is_paused", self._is_paused)
        app.router.add_post("/collective_rpc", self._collective_rpc)

    @web.middleware
    async def _weight_version_header(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        version = self.weight_version  # the version the request started at: an update mid-request shows
        response = await handler(request)
        if not response.prepared:
            response.headers["X-Weight-Version"] = version
        return response

    async def _get_weight_version(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"weight_version": self.weight_version})

    async def _update_weights_from_disk(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        path = body.get("model_path")
        version = body.get("weight_version")
        if not isinstance(path, str) or not path.strip():
            return web.json_response({"success": False, "message": "model_path must be a non-empty path"}, status=400)
        if version is not None and (not isinstance(version, (str, int)) or isinstance(version, bool)):
            return web.json_response({"success": False, "message": "weight_version must be a string"}, status=400)
        if path.startswith("/nonexistent"):
            self.stats["refits_failed"] += 1
            return web.json_response({"success": False, "message": f"failed to load weights from {path}"}, status=400)
        if version is not None:
            self.weight_version = str(version)[:256]
        self.stats["refits"] += 1
        return web.json_response({"success": True, "message": "Succeeded to update model weights."})

    async def _update_weight_version(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        version = body.get("new_version")
        if not isinstance(version, str) or not version:
            raise _BadRequest("new_version must be a non-empty string")
        self.weight_version = version[:256]
        return web.json_response({"success": True, "new_version": self.weight_version})  # vLLM 0.32's answer

    async def _pause(self, request: web.Request) -> web.StreamResponse:
        self.faults.engine_hang = True  # what a paused vLLM does to new generations: they wait, they do not fail
        return web.json_response({"status": "paused"})

    async def _resume(self, request: web.Request) -> web.StreamResponse:
        self.faults.engine_hang = False
        self._unhang.set()
        return web.json_response({"status": "resumed"})

    async def _is_paused(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"is_paused": self.faults.engine_hang})

    async def _collective_rpc(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        if body.get("method") != "reload_weights":
            raise _BadRequest(f"the sim shard answers collective_rpc reload_weights only, not {body.get('method')!r}")
        self.stats["refits"] += 1
        return web.json_response({"results": [None]})

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        text = (
            "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
            "# TYPE process_start_time_seconds gauge\n"
            f"process_start_time_seconds {self.started_at!r}\n"
        )
        return web.Response(text=text, content_type="text/plain")


def create_app(config: SimShardConfig | None = None) -> web.Application:
    """Build the sim shard application (for in-process use in tests; the CLI runs it in its own process)."""
    return SimShard(config or SimShardConfig()).app()


def _bound_port(site: web.TCPSite, requested: int) -> int:
    """The port a site listens on (the kernel's choice when ``requested`` is 0)."""
    sockets = getattr(site._server, "sockets", None) or ()
    for sock in sockets:
        return int(sock.getsockname()[1])
    return requested


async def serve(
    config: SimShardConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    exit_with_parent: bool = False,
    ready: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Run a sim shard until SIGTERM/SIGINT (or, with ``exit_with_parent``, until the parent process is gone).

    ``ready`` is called with ``{"host", "port", "pid", "model"}`` once the socket listens (the CLI prints it),
    so a parent can ask for port 0 and learn the real one.
    """
    import signal

    parent = os.getppid()  # before readiness is announced: a parent may exit the moment it reads the ready line
    shard = SimShard(config)
    runner = web.AppRunner(shard.app(), handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_port = _bound_port(site, port)
        if ready is not None:
            ready({"host": host, "port": bound_port, "pid": os.getpid(), "model": config.model})
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            except TimeoutError:
                if exit_with_parent and os.getppid() != parent:
                    log.warning("sim shard: parent %d is gone, exiting", parent)
                    break
    finally:
        await runner.cleanup()  # stops listening, then waits for the requests in flight (up to shutdown_timeout)
        # The counters once the drain is over, for whoever stopped the shard (its admin endpoint is gone now).
        print(FINAL_STATS + json.dumps(dict(shard.stats)), file=sys.stderr, flush=True)
