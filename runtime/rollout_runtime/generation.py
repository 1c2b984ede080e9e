"""The rollout side of generation: call ``/v1/completions`` on the chosen shard and fail in the taxonomy's terms.

What a failure means decides what the dispatcher does with it, so the mapping is explicit:

- cannot connect, connection dropped, response cut off -> :class:`GenerationUnavailable` (infra);
- no answer within the deadline -> :class:`RolloutTimeout` (infra);
- an HTTP error status -> :func:`~rollout_runtime.failures.http_status_is_infra` decides, as it does for every other
  client (5xx, 408, 425, 429: GenerationUnavailable with the status and any Retry-After; any other 4xx:
  :class:`RolloutDataFailure` with the server's own message, bounded). A 401, 403, 407 or 404 (vLLM's "The model
  `x` does not exist." among them) is one of those data failures; the dispatcher's blame then reads it as one sick
  shard or a misconfigured fleet from the evidence (:mod:`rollout_runtime.dispatch.blame`);
- a redirect (3xx) -> GenerationUnavailable naming the status and the Location's host: redirects are never
  followed, since the prompt and the trainer's API-key header would go to a host that is not a shard;
- a 200 whose body is not a completion (invalid JSON, an HTML page, ``choices: []``, an error object) ->
  GenerationUnavailable with status 200 (:func:`~rollout_runtime.http_verdicts.completion_problem` says why): a sane
  shard answers a completion; blame re-reads it as the prompt's when it follows one prompt across shards;
- a body larger than the bound -> GenerationUnavailable.

A prompt longer than ``max_model_len`` arrives as vLLM's 400 ("This model's maximum context length is N tokens...")
and becomes a RolloutDataFailure carrying that message, so the ledger says exactly why.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp

from rollout_runtime import http_verdicts
from rollout_runtime.dispatch.progress import report_progress
from rollout_runtime.failures import (
    MAX_MESSAGE_CHARS,
    GenerationUnavailable,
    RolloutDataFailure,
    RolloutTimeout,
)
from rollout_runtime.redaction import redact_url, redirect_message, safe_message
from rollout_runtime.results import (
    Completion,
    GenerationOptions,
    MalformedCompletion,
    StreamAssembler,
    parse_completion,
)
from rollout_runtime.shards.model import Shard

__all__ = ["Completion", "GenerationClient", "GenerationOptions", "judge_completion", "judge_stream_start"]

DEFAULT_MAX_RESPONSE_BYTES: Final[int] = 8 * 1024 * 1024


_server_message = http_verdicts.server_message


class GenerationClient:
    """Calls a shard's OpenAI-compatible completions API. One ClientSession, created on first use.

    ``timeout_seconds`` bounds one whole request; the dispatcher's per-attempt timeout usually bounds it as well.
    """

    def __init__(
        self,
        *,
        timeout_seconds: float = 300.0,
        connect_timeout_seconds: float = 10.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_connections: int = 512,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if timeout_seconds <= 0 or connect_timeout_seconds <= 0 or max_response_bytes <= 0:
            raise ValueError("timeouts and max_response_bytes must be positive")
        self.timeout_seconds = timeout_seconds
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds, sock_connect=connect_timeout_seconds)
        self.max_response_bytes = max_response_bytes
        self._max_connections = max_connections
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> GenerationClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if not self._owns_session:
                raise RuntimeError("the ClientSession passed to GenerationClient is closed")
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections), trust_env=False
            )
        return self._session

    async def complete(
        self,
        shard: Shard,
        prompt: str | list[int],
        *,
        max_tokens: int | None = 64,
        temperature: float = 0.0,
        extra: Mapping[str, Any] | None = None,
        options: GenerationOptions | None = None,
    ) -> Completion:
        """POST ``/v1/completions`` for one prompt; every choice, typed. Raises taxonomy failures only.

        ``options`` asks for token ids, logprobs, n choices or streaming (see :class:`GenerationOptions`);
        ``extra`` fields are sent as given and win over both.
        """
        payload: dict[str, Any] = {"prompt": prompt, "temperature": temperature}
        return await self._generate(shard, "/v1/completions", payload, max_tokens, extra, options, chat=False)

    async def chat(
        self,
        shard: Shard,
        messages: list[Mapping[str, Any]],
        *,
        max_tokens: int | None = 64,
        temperature: float = 0.0,
        extra: Mapping[str, Any] | None = None,
        options: GenerationOptions | None = None,
    ) -> Completion:
        """POST ``/v1/chat/completions``; every choice's message content, typed (as :meth:`complete`)."""
        payload: dict[str, Any] = {"messages": list(messages), "temperature": temperature}
        return await self._generate(shard, "/v1/chat/completions", payload, max_tokens, extra, options, chat=True)

    async def _generate(
        self,
        shard: Shard,
        path: str,
        payload: dict[str, Any],
        max_tokens: int | None,
        extra: Mapping[str, Any] | None,
        options: GenerationOptions | None,
        *,
        chat: bool,
    ) -> Completion:
        if options is not None:
            payload.update(options.request_fields(chat=chat))
        payload.update(extra or {})
        if shard.model:
            payload["model"] = shard.model
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        if payload.get("stream"):
            return await self._stream(shard, path, payload, chat=chat)
        body = await self._post(shard, path, payload)
        return judge_completion(shard, body, chat=chat)

    async def _post(self, shard: Shard, path: str, payload: Mapping[str, Any]) -> bytes:
        url = shard.endpoint + path
        where = f"shard {shard.name} ({redact_url(shard.endpoint)})"
        try:
            async with asyncio.timeout(self.timeout_seconds):
                async with self._get_session().post(
                    url, json=payload, timeout=self._timeout, allow_redirects=False
                ) as response:
                    status = response.status
                    if 300 <= status < 400:  # never followed: the prompt and the API key would go there
                        raise GenerationUnavailable(redirect_message(where, status, response.headers), status=status)
                    body = await self._read_bounded(response, where)
                    headers = response.headers
        except TimeoutError as exc:
            raise RolloutTimeout(f"{where} did not answer within {self.timeout_seconds:g} s") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as exc:
            raise GenerationUnavailable(safe_message(f"{where}: {type(exc).__name__}: {exc}")) from exc
        except aiohttp.ClientResponseError as exc:  # an unparseable HTTP response: the shard is broken
            message = safe_message(f"{where}: invalid HTTP response: {exc.message}")
            raise GenerationUnavailable(message, status=exc.status) from exc
        if status >= 400 or status < 200:
            self._raise_for_status(status, body, where, headers)
        return body

    async def _read_bounded(self, response: aiohttp.ClientResponse, where: str) -> bytes:
        limit = self.max_response_bytes
        too_large = f"{where}: response larger than {limit} bytes"
        if response.content_length is not None and response.content_length > limit:
            raise GenerationUnavailable(too_large, status=response.status)
        buffer = bytearray()
        async for chunk in response.content.iter_chunked(64 * 1024):
            buffer += chunk
            if len(buffer) > limit:
                raise GenerationUnavailable(too_large, status=response.status)
        return bytes(buffer)

    @staticmethod
    def _raise_for_status(status: int, body: bytes, where: str, headers: Mapping[str, str] | None = None) -> None:
        message = safe_message(_server_message(body[: MAX_MESSAGE_CHARS * 4]) or f"HTTP {status}")
        if status < 200:
            raise RolloutDataFailure(safe_message(f"{where} answered HTTP {status}: {message}"), status=status)
        found = http_verdicts.verdict(status, message, http_verdicts.retry_after_seconds(headers))
        failure = http_verdicts.failure_for(found, where)
        raise type(failure)(safe_message(str(failure)), status=failure.status, retry_after=failure.retry_after)

    async def _stream(self, shard: Shard, path: str, payload: Mapping[str, Any], *, chat: bool) -> Completion:
        """POST with ``stream: true`` and fold the SSE events; each chunk's tokens count as the attempt's progress.

        A stream that stops before ``data: [DONE]`` (connection cut, server died) is GenerationUnavailable: the
        shard, not the prompt, failed, and nothing of the partial answer is returned.
        """
        url = shard.endpoint + path
        where = f"shard {shard.name} ({redact_url(shard.endpoint)})"
        assembler = StreamAssembler(chat=chat)
        limit = self.max_response_bytes
        try:
            async with asyncio.timeout(self.timeout_seconds):
                async with self._get_session().post(
                    url, json=payload, timeout=self._timeout, allow_redirects=False
                ) as response:
                    status = response.status
                    if 300 <= status < 400:
                        raise GenerationUnavailable(redirect_message(where, status, response.headers), status=status)
                    if status >= 400 or status < 200:
                        body = await self._read_bounded(response, where)
                        self._raise_for_status(status, body, where, response.headers)
                    read = 0
                    async for line in response.content:
                        read += len(line)
                        if read > limit:
                            raise GenerationUnavailable(f"{where}: response larger than {limit} bytes", status=status)
                        tokens = assembler.add_line(line)
                        if tokens:
                            report_progress(tokens)
                        if assembler.done:
                            break
        except TimeoutError as exc:
            raise RolloutTimeout(f"{where} did not finish streaming within {self.timeout_seconds:g} s") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as exc:
            raise GenerationUnavailable(safe_message(f"{where}: stream cut: {type(exc).__name__}: {exc}")) from exc
        except aiohttp.ClientResponseError as exc:
            message = safe_message(f"{where}: invalid HTTP response: {exc.message}")
            raise GenerationUnavailable(message, status=exc.status) from exc
        except MalformedCompletion as exc:
            raise _not_a_completion(shard, str(exc)) from exc
        if not assembler.done:
            raise GenerationUnavailable(f"{where}: the stream ended before data: [DONE]", status=status)
        try:
            return assembler.result(shard=shard.name, model=shard.model)
        except MalformedCompletion as exc:
            raise _not_a_completion(shard, str(exc)) from exc


def judge_completion(shard: Shard, body: bytes, *, chat: bool) -> Completion:
    """The one verdict on a 200 body, for every reader of one (this client, the router): the completion, or
    GenerationUnavailable with status 200 saying why it is not one (invalid JSON, an error object, ``choices: []``)."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _not_a_completion(shard, f"{type(exc).__name__}: {exc}") from exc
    problem = http_verdicts.completion_problem(payload, chat=chat)
    if problem is None:
        try:
            return parse_completion(payload, chat=chat, shard=shard.name, model=shard.model)
        except MalformedCompletion as exc:
            problem = str(exc)
    raise _not_a_completion(shard, problem)


def judge_stream_start(shard: Shard, lines: list[bytes], *, chat: bool) -> bool:
    """The same verdict on the start of a 200 stream: its lines up to the end of an SSE event, folded as this client
    folds a whole stream. True once a chunk carried a choice (False: none yet, read on); raises
    GenerationUnavailable with status 200 for an error object, a chunk that is not a completion's, or a stream that is
    over (``data: [DONE]``) before any choice."""
    assembler = StreamAssembler(chat=chat)
    try:
        for line in lines:
            assembler.add_line(line)
            if assembler.done:
                assembler.result(shard=shard.name, model=shard.model)  # raises unless it carried a choice
    except MalformedCompletion as exc:
        raise _not_a_completion(shard, str(exc)) from exc
    return assembler.started


def _not_a_completion(shard: Shard, problem: str) -> GenerationUnavailable:
    """The one verdict for a 200 that is not a completion, streamed or not (see the module docstring)."""
    found = http_verdicts.not_a_completion(200, problem)
    failure = http_verdicts.failure_for(found, f"shard {shard.name}")
    return GenerationUnavailable(safe_message(str(failure)), status=200)
