"""An ``AsyncOpenAI``-shaped client that routes every request through the dispatcher.

Drop-in for trainer code that calls the OpenAI SDK: ``client.completions.create(...)`` and
``client.chat.completions.create(...)`` take the SDK's keyword arguments and return objects with the SDK's attribute
names (``choices[0].text``, ``choices[0].message.content``, ``choices[0].logprobs.token_logprobs``, ``usage``...),
plus ``token_ids`` per choice and ``shard``/``weights_version`` on the response. Each call is one prompt of a
:class:`~rollout_runtime.dispatch.DispatchSession`: retried elsewhere on infra failures, accounted once, and watched
for progress (requests stream to the shard when ``stream_to_shards`` is on, so a stalled shard is noticed by its
silence). A prompt that cannot be rolled out raises :class:`RolloutRequestFailed` carrying its outcome.

``stream=True`` returns an async iterator that yields the committed response once (as one final chunk): a caller
never sees a partial answer from an attempt that was later abandoned and redispatched.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout_runtime.dispatch.engine import Dispatcher
from rollout_runtime.dispatch.outcomes import Completed, DataFailed, Skipped
from rollout_runtime.dispatch.session import DispatchSession
from rollout_runtime.generation import GenerationClient
from rollout_runtime.results import Choice, Completion, GenerationOptions
from rollout_runtime.shards.model import Shard

__all__ = [
    "ChatCompletionObject",
    "CompletionObject",
    "DispatchedOpenAI",
    "RolloutRequestFailed",
]


class RolloutRequestFailed(RuntimeError):
    """The dispatcher could not roll the request out (data-failed or skipped); ``outcome`` says why."""

    def __init__(self, outcome: DataFailed[Any] | Skipped[Any]) -> None:
        super().__init__(f"request {outcome.prompt_id!r} failed after {outcome.attempts} attempt(s): {outcome.reason}")
        self.outcome = outcome


@dataclass(frozen=True)
class UsageObject:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class CompletionLogprobs:
    """The SDK's ``Logprobs`` of a text completion."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int] | None = None


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class ChatLogprobs:
    content: list[TokenLogprob] | None


@dataclass(frozen=True)
class CompletionChoiceObject:
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None
    token_ids: list[int] | None = None


@dataclass(frozen=True)
class MessageObject:
    content: str
    role: str = "assistant"


@dataclass(frozen=True)
class ChatChoiceObject:
    index: int
    message: MessageObject
    finish_reason: str | None
    logprobs: ChatLogprobs | None
    token_ids: list[int] | None = None


@dataclass(frozen=True)
class CompletionObject:
    """Shaped like the SDK's ``Completion``."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoiceObject]
    usage: UsageObject
    shard: str
    weights_version: str | None
    object: str = "text_completion"


@dataclass(frozen=True)
class ChatCompletionObject:
    """Shaped like the SDK's ``ChatCompletion``."""

    id: str
    created: int
    model: str
    choices: list[ChatChoiceObject]
    usage: UsageObject
    shard: str
    weights_version: str | None
    object: str = "chat.completion"


def _usage(completion: Completion) -> UsageObject:
    usage = completion.usage
    return UsageObject(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)


def _completion_choice(choice: Choice) -> CompletionChoiceObject:
    logprobs = None
    if choice.tokens is not None and choice.logprobs is not None:
        top = [dict(t) for t in choice.top_logprobs] if choice.top_logprobs is not None else None
        logprobs = CompletionLogprobs(list(choice.tokens), list(choice.logprobs), top)
    ids = list(choice.token_ids) if choice.token_ids is not None else None
    return CompletionChoiceObject(choice.index, choice.text, choice.finish_reason, logprobs, ids)


def _chat_choice(choice: Choice) -> ChatChoiceObject:
    logprobs = None
    if choice.tokens is not None and choice.logprobs is not None:
        content = [
            TokenLogprob(t, lp if lp is not None else 0.0) for t, lp in zip(choice.tokens, choice.logprobs, strict=True)
        ]
        logprobs = ChatLogprobs(content)
    ids = list(choice.token_ids) if choice.token_ids is not None else None
    return ChatChoiceObject(choice.index, MessageObject(choice.text), choice.finish_reason, logprobs, ids)


def _ident(completion: Completion, prefix: str) -> str:
    raw_id = completion.raw.get("id") if isinstance(completion.raw, Mapping) else None
    return str(raw_id) if raw_id else f"{prefix}-{completion.shard}-{time.monotonic_ns()}"


@dataclass(frozen=True)
class _Request:
    chat: bool
    body: Mapping[str, Any]


class _Endpoint:
    def __init__(self, owner: DispatchedOpenAI, *, chat: bool) -> None:
        self._owner = owner
        self._chat = chat

    async def create(self, **kwargs: Any) -> Any:
        """The SDK's ``create``: same keyword arguments; ``model`` is ignored (each shard names its own)."""
        stream = bool(kwargs.pop("stream", False))
        kwargs.pop("stream_options", None)
        kwargs.pop("model", None)
        extra_body = kwargs.pop("extra_body", None) or {}
        response = await self._owner._submit(_Request(self._chat, {**kwargs, **extra_body}))
        return _replay(response) if stream else response


class _Chat:
    def __init__(self, owner: DispatchedOpenAI) -> None:
        self.completions = _Endpoint(owner, chat=True)


class DispatchedOpenAI:
    """``client.completions.create`` / ``client.chat.completions.create`` through a dispatcher session.

    ::

        async with Dispatcher(source, policy) as dispatcher, DispatchedOpenAI(dispatcher) as client:
            response = await client.completions.create(model="m", prompt="What is 2 + 2?", logprobs=0)
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        generation: GenerationClient | None = None,
        *,
        stream_to_shards: bool = True,
        token_ids: bool = True,
    ) -> None:
        self._generation = generation or GenerationClient()
        self._owns_generation = generation is None
        self._stream = stream_to_shards
        self._token_ids = token_ids
        self.session: DispatchSession[_Request, Any] = dispatcher.session(self._rollout, drop_rules=False)
        self.completions = _Endpoint(self, chat=False)
        self.chat = _Chat(self)

    async def __aenter__(self) -> DispatchedOpenAI:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.session.aclose()
        if self._owns_generation:
            await self._generation.close()

    async def _rollout(self, shard: Shard, request: _Request) -> CompletionObject | ChatCompletionObject:
        body = dict(request.body)
        top = body.pop("top_logprobs", None)
        logprobs = body.pop("logprobs", None)
        if request.chat:
            top_k = (int(top or 0)) if logprobs else None
        else:
            top_k = int(logprobs) if logprobs is not None else None
        options = GenerationOptions(
            n=int(body.pop("n", 1) or 1), logprobs=top_k, token_ids=self._token_ids, stream=self._stream
        )
        max_tokens = body.pop("max_tokens", body.pop("max_completion_tokens", 64))
        temperature = float(body.pop("temperature", 0.0) or 0.0)
        if request.chat:
            messages: Sequence[Mapping[str, Any]] = body.pop("messages")
            completion = await self._generation.chat(
                shard, list(messages), max_tokens=max_tokens, temperature=temperature, extra=body, options=options
            )
            return ChatCompletionObject(
                _ident(completion, "chatcmpl"),
                int(time.time()),
                completion.model,
                [_chat_choice(c) for c in completion.choices],
                _usage(completion),
                completion.shard,
                completion.weights_version,
            )
        prompt = body.pop("prompt")
        completion = await self._generation.complete(
            shard, prompt, max_tokens=max_tokens, temperature=temperature, extra=body, options=options
        )
        return CompletionObject(
            _ident(completion, "cmpl"),
            int(time.time()),
            completion.model,
            [_completion_choice(c) for c in completion.choices],
            _usage(completion),
            completion.shard,
            completion.weights_version,
        )

    async def _submit(self, request: _Request) -> Any:
        outcome = await self.session.submit(request)
        if isinstance(outcome, Completed):
            return outcome.result
        raise RolloutRequestFailed(outcome)


async def _replay(response: CompletionObject | ChatCompletionObject) -> AsyncIterator[Any]:
    """The committed answer, once: streaming to the caller starts only after exactly-once commit."""
    yield response
