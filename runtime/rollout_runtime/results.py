"""Typed generation results: what a trainer needs from a completion, parsed from vLLM/SGLang/OpenAI bodies.

Pure: bytes or decoded JSON in, frozen dataclasses out; no I/O. One shape for every way a result arrives (a JSON
body or an SSE stream folded chunk by chunk, see :class:`StreamAssembler`), so a trainer never digs in ``raw``.

Request options (:class:`GenerationOptions`) and how they map to the servers' own fields:

====================  ==========================================  ==========================================
option                vLLM (``dialect="vllm"``)                   SGLang / plain OpenAI (``"sglang"``, ``"openai"``)
====================  ==========================================  ==========================================
``n``                 ``n``                                       ``n``
``logprobs=k``        completions: ``logprobs: k``;               the same OpenAI fields
                      chat: ``logprobs: true, top_logprobs: k``
``token_ids=True``    ``return_token_ids: true`` (choice          not sent; ids come from ``token_id:N``
                      ``token_ids``), and with logprobs           logprob tokens only if the server returns
                      ``return_tokens_as_token_ids: true``        them, else ``token_ids`` is None
``prompt_logprobs=k`` ``prompt_logprobs: k`` (choice-level on     not sent (SGLang's native ``/generate`` has
                      completions, response-level on chat)       ``logprob_start_len``; not this client's API)
``stream=True``       ``stream: true`` and ``stream_options:      the same
                      {include_usage: true}``; ends with
                      ``data: [DONE]``
====================  ==========================================  ==========================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

__all__ = [
    "Choice",
    "Completion",
    "GenerationOptions",
    "MalformedCompletion",
    "StreamAssembler",
    "Usage",
    "parse_completion",
]

Dialect = Literal["vllm", "sglang", "openai"]
_TOKEN_ID: Final[re.Pattern[str]] = re.compile(r"token_id:(-?\d+)")


class MalformedCompletion(ValueError):
    """A 200 body (or stream chunk) that is not a completion; the caller maps it to the failure taxonomy."""


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """What to ask a shard for beyond text. Defaults ask for nothing extra (the cheapest request)."""

    n: int = 1
    """Choices per prompt (GRPO-style groups)."""
    logprobs: int | None = None
    """Logprobs of each completion token, plus this many top alternatives per position (0: only the sampled one)."""
    prompt_logprobs: int | None = None
    """Logprobs of the prompt tokens (vLLM), plus this many alternatives."""
    token_ids: bool = False
    """Completion token ids (vLLM's ``return_token_ids``/``return_tokens_as_token_ids``)."""
    stream: bool = False
    """Stream the answer over SSE; lets the dispatcher's progress watchdog see every token."""
    dialect: Dialect = "vllm"
    """Which server's extension fields to send (see the module docstring's table)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")

    def request_fields(self, *, chat: bool) -> dict[str, Any]:
        """The request body fields these options add (merged under the caller's ``extra``)."""
        fields: dict[str, Any] = {}
        if self.n != 1:
            fields["n"] = self.n
        if self.logprobs is not None:
            if chat:
                fields["logprobs"] = True
                fields["top_logprobs"] = self.logprobs
            else:
                fields["logprobs"] = self.logprobs
        if self.stream:
            fields["stream"] = True
            fields["stream_options"] = {"include_usage": True}
        if self.dialect == "vllm":
            if self.token_ids:
                fields["return_token_ids"] = True
                if self.logprobs is not None:
                    fields["return_tokens_as_token_ids"] = True
            if self.prompt_logprobs is not None:
                fields["prompt_logprobs"] = self.prompt_logprobs
        return fields


@dataclass(frozen=True, slots=True)
class Usage:
    """Token accounting of one response (all choices)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Choice:
    """One of the ``n`` samples. Token-level fields are None when not asked for (or the server did not send them)."""

    index: int
    text: str
    finish_reason: str | None = None
    token_ids: tuple[int, ...] | None = None
    tokens: tuple[str, ...] | None = None
    logprobs: tuple[float | None, ...] | None = None
    """Logprob of each completion token, aligned with ``tokens``/``token_ids``."""
    top_logprobs: tuple[Mapping[str, float], ...] | None = None
    prompt_logprobs: tuple[Mapping[int, float] | None, ...] | None = None
    """Per prompt token: token id -> logprob (the first position has none), when asked."""
    stop_reason: int | str | None = None


@dataclass(frozen=True)
class Completion:
    """A completion response: every choice, usage, where it ran; the first choice's fields at the top.

    ``shard`` and ``weights_version`` say which shard and which weights produced it (``weights_version`` is None
    while the shard's weights are unknown).
    """

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    model: str
    shard: str
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    choices: tuple[Choice, ...] = ()
    usage: Usage = Usage()
    prompt_token_ids: tuple[int, ...] | None = None
    weights_version: str | None = None

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        return self.choices[0].token_ids if self.choices else None

    @property
    def logprobs(self) -> tuple[float | None, ...] | None:
        return self.choices[0].logprobs if self.choices else None

    @property
    def prompt_logprobs(self) -> tuple[Mapping[int, float] | None, ...] | None:
        return self.choices[0].prompt_logprobs if self.choices else None


# -- field readers: each raises MalformedCompletion (via TypeError/ValueError) on a wrong shape -----------------


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedCompletion(f"{name} is not an integer: {type(value).__name__}")
    return value


def _float_or_none(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedCompletion(f"a logprob is not a number: {type(value).__name__}")
    return float(value)


def _ids_from_tokens(tokens: Sequence[str]) -> tuple[int, ...] | None:
    ids: list[int] = []
    for token in tokens:
        match = _TOKEN_ID.fullmatch(token)
        if match is None:
            return None
        ids.append(int(match.group(1)))
    return tuple(ids)


def _token_ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise MalformedCompletion("token_ids is not a list")
    return tuple(_int(v, "a token id") for v in value)


def _top(value: Any) -> Mapping[str, float]:
    if isinstance(value, dict):  # completions: {token: logprob}
        return {str(k): float(_float_or_none(v) or 0.0) for k, v in value.items()}
    if isinstance(value, list):  # chat: [{token, logprob}, ...]
        return {str(item["token"]): float(_float_or_none(item["logprob"]) or 0.0) for item in value}
    raise MalformedCompletion("top_logprobs entry is neither an object nor a list")


@dataclass(slots=True)
class _TokenColumns:
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    top: list[Mapping[str, float]] = field(default_factory=list)
    has_top: bool = False

    def add(self, logprobs: Any) -> None:
        """Append one (possibly partial, when streamed) logprobs object of either endpoint's shape."""
        if logprobs is None:
            return
        if not isinstance(logprobs, dict):
            raise MalformedCompletion("logprobs is not an object")
        content = logprobs.get("content")
        if content is not None or "tokens" not in logprobs:  # chat: {"content": [{token, logprob, top_logprobs}]}
            for item in content or ():
                self.tokens.append(str(item["token"]))
                self.logprobs.append(_float_or_none(item.get("logprob")))
                top = item.get("top_logprobs")
                if top:
                    self.has_top = True
                self.top.append(_top(top or []))
            return
        tokens = logprobs.get("tokens") or []  # completions: parallel lists
        values = logprobs.get("token_logprobs") or [None] * len(tokens)
        tops = logprobs.get("top_logprobs") or []
        if len(values) != len(tokens):
            raise MalformedCompletion("logprobs.tokens and token_logprobs differ in length")
        self.tokens.extend(str(t) for t in tokens)
        self.logprobs.extend(_float_or_none(v) for v in values)
        for index in range(len(tokens)):
            top = tops[index] if index < len(tops) else None
            if top:
                self.has_top = True
            self.top.append(_top(top or {}))

    @property
    def empty(self) -> bool:
        return not self.tokens


def _prompt_logprobs(value: Any) -> tuple[Mapping[int, float] | None, ...] | None:
    """vLLM's ``[null, {"<id>": {"logprob": x, ...}}, ...]`` as id -> logprob per position."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise MalformedCompletion("prompt_logprobs is not a list")
    positions: list[Mapping[int, float] | None] = []
    for entry in value:
        if entry is None:
            positions.append(None)
            continue
        if not isinstance(entry, dict):
            raise MalformedCompletion("a prompt_logprobs entry is not an object")
        positions.append(
            {int(k): float(_float_or_none(v["logprob"] if isinstance(v, dict) else v) or 0.0) for k, v in entry.items()}
        )
    return tuple(positions)


ABORTED: Final[str] = "abort"
"""vLLM's finish reason for a request it gave up on (``/pause?mode=abort``, SIGTERM without ``--shutdown-timeout``):
a 200 with the tokens generated so far. Not a completion: a rollout must never train on a cut-off sample."""


def _finish(choice: Mapping[str, Any]) -> str | None:
    finish = choice.get("finish_reason")
    return finish if isinstance(finish, str) else None


def _stop_reason(choice: Mapping[str, Any]) -> int | str | None:
    value = choice.get("stop_reason")
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def _choice(
    index: int,
    text: str,
    finish: str | None,
    stop: int | str | None,
    ids: tuple[int, ...] | None,
    columns: _TokenColumns,
    prompt_logprobs: tuple[Mapping[int, float] | None, ...] | None,
) -> Choice:
    tokens = tuple(columns.tokens) if not columns.empty else None
    if ids is None and tokens is not None:
        ids = _ids_from_tokens(tokens)
    return Choice(
        index=index,
        text=text,
        finish_reason=finish,
        token_ids=ids,
        tokens=tokens,
        logprobs=tuple(columns.logprobs) if not columns.empty else None,
        top_logprobs=tuple(columns.top) if columns.has_top else None,
        prompt_logprobs=prompt_logprobs,
        stop_reason=stop,
    )


def _usage(value: Any) -> Usage:
    if not isinstance(value, dict):
        return Usage()
    prompt = int(value.get("prompt_tokens") or 0)
    completion = int(value.get("completion_tokens") or 0)
    return Usage(prompt, completion, int(value.get("total_tokens") or prompt + completion))


def _assemble(
    payload: Mapping[str, Any], choices: list[Choice], usage: Usage, shard: str, default_model: str
) -> Completion:
    if not choices:
        raise MalformedCompletion("the response has no choices")
    if any(choice.finish_reason == ABORTED for choice in choices):
        raise MalformedCompletion(
            'the server aborted the generation (finish_reason "abort": vLLM answers so when it is paused with '
            "mode=abort or shut down): its text is partial"
        )
    choices.sort(key=lambda c: c.index)
    first = choices[0]
    return Completion(
        text=first.text,
        finish_reason=first.finish_reason,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        model=str(payload.get("model") or default_model),
        shard=shard,
        raw=payload,
        choices=tuple(choices),
        usage=usage,
        prompt_token_ids=_prompt_token_ids(payload),
    )


def _prompt_token_ids(payload: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The prompt's token ids: top level in vLLM's chat answers, in each choice of its completions answers (every
    choice repeats the same prompt)."""
    if payload.get("prompt_token_ids") is not None:
        return _token_ids(payload["prompt_token_ids"])
    for raw in payload.get("choices") or ():
        if isinstance(raw, dict) and raw.get("prompt_token_ids") is not None:
            return _token_ids(raw["prompt_token_ids"])
    return None


def parse_completion(body: bytes | Mapping[str, Any], *, chat: bool, shard: str, model: str = "") -> Completion:
    """A non-streamed ``/v1/completions`` or ``/v1/chat/completions`` body as a :class:`Completion`.

    Raises :class:`MalformedCompletion` when it is not one (not JSON, no choices, a text that is not a string...).
    """
    try:
        payload = json.loads(body) if isinstance(body, bytes | bytearray) else body
        if not isinstance(payload, dict):
            raise MalformedCompletion("the body is not a JSON object")
        raw_choices = payload["choices"]
        if not isinstance(raw_choices, list):
            raise MalformedCompletion("choices is not a list")
        chat_prompt = _prompt_logprobs(payload.get("prompt_logprobs")) if chat else None
        choices: list[Choice] = []
        for position, raw in enumerate(raw_choices):
            text = raw["message"]["content"] if chat else raw["text"]
            if chat and text is None:
                text = ""  # a chat answer that is only a tool call has no content
            if not isinstance(text, str):
                raise MalformedCompletion("completion text is not a string")
            columns = _TokenColumns()
            columns.add(raw.get("logprobs"))
            prompt_lp = chat_prompt if chat else _prompt_logprobs(raw.get("prompt_logprobs"))
            index = raw.get("index", position)
            choices.append(
                _choice(
                    _int(index, "choice index"),
                    text,
                    _finish(raw),
                    _stop_reason(raw),
                    _token_ids(raw.get("token_ids")),
                    columns,
                    prompt_lp,
                )
            )
        return _assemble(payload, choices, _usage(payload.get("usage")), shard, model)
    except MalformedCompletion:
        raise
    except (ValueError, RecursionError, LookupError, TypeError, AttributeError) as exc:
        raise MalformedCompletion(f"{type(exc).__name__}: {exc}") from exc


@dataclass(slots=True)
class _Partial:
    text: list[str] = field(default_factory=list)
    ids: list[int] | None = None
    columns: _TokenColumns = field(default_factory=_TokenColumns)
    finish: str | None = None
    stop: int | str | None = None
    prompt_logprobs: tuple[Mapping[int, float] | None, ...] | None = None


class StreamAssembler:
    """Folds SSE chunks (``data: {...}``, then ``data: [DONE]``) of either endpoint into one :class:`Completion`.

    Feed each decoded ``data`` payload to :meth:`add`; it returns how many tokens (or text deltas) the chunk
    carried, which is what the progress watchdog counts. :meth:`result` after ``[DONE]``.
    """

    __slots__ = ("_chat", "_choices", "_first", "_prompt_ids", "_usage", "done")

    def __init__(self, *, chat: bool) -> None:
        self._chat = chat
        self._choices: dict[int, _Partial] = {}
        self._usage = Usage()
        self._first: dict[str, Any] | None = None
        self._prompt_ids: tuple[int, ...] | None = None
        self.done = False

    def add(self, data: str) -> int:
        """One ``data:`` payload; returns the tokens it carried. Raises MalformedCompletion on a bad chunk."""
        if data == "[DONE]":
            self.done = True
            return 0
        try:
            chunk = json.loads(data)
            if not isinstance(chunk, dict):
                raise MalformedCompletion("a stream chunk is not a JSON object")
            if "error" in chunk and "choices" not in chunk:
                raise MalformedCompletion(f"the stream carried an error: {str(chunk['error'])[:200]}")
            if self._first is None:
                self._first = chunk
            if self._prompt_ids is None:
                self._prompt_ids = _prompt_token_ids(chunk)
            if chunk.get("usage"):
                self._usage = _usage(chunk["usage"])
            tokens = 0
            for raw in chunk.get("choices") or ():
                index = _int(raw.get("index", 0), "choice index")
                partial = self._choices.get(index)
                if partial is None:
                    partial = self._choices[index] = _Partial()
                piece = (raw.get("delta") or {}).get("content") if self._chat else raw.get("text")
                if piece:
                    if not isinstance(piece, str):
                        raise MalformedCompletion("a streamed text delta is not a string")
                    partial.text.append(piece)
                before = len(partial.columns.tokens)
                partial.columns.add(raw.get("logprobs"))
                ids = raw.get("token_ids")
                if ids is not None:
                    partial.ids = (partial.ids or []) + list(_token_ids(ids) or ())
                lp = raw.get("prompt_logprobs")
                if lp is not None:
                    partial.prompt_logprobs = _prompt_logprobs(lp)
                if raw.get("finish_reason") is not None:
                    partial.finish = _finish(raw)
                    partial.stop = _stop_reason(raw)
                tokens += max(len(partial.columns.tokens) - before, len(ids or ()), 1 if piece else 0)
            if self._chat and chunk.get("prompt_logprobs") is not None:
                shared = _prompt_logprobs(chunk["prompt_logprobs"])
                for partial in self._choices.values():
                    partial.prompt_logprobs = shared
            return tokens
        except MalformedCompletion:
            raise
        except (ValueError, RecursionError, LookupError, TypeError, AttributeError) as exc:
            raise MalformedCompletion(f"bad stream chunk: {type(exc).__name__}: {exc}") from exc

    @property
    def started(self) -> bool:
        """Whether a chunk carried a choice yet."""
        return bool(self._choices)

    def add_line(self, line: bytes) -> int | None:
        """One line of the SSE stream as it arrived: a ``data:`` line is :meth:`add`-ed (its tokens returned); None
        for the lines that carry no data (blank separators, comments such as ``: ping``, event and id fields)."""
        if not line.startswith(b"data:"):
            return None
        return self.add(line[5:].strip().decode("utf-8", errors="replace"))

    def result(self, *, shard: str, model: str = "") -> Completion:
        """The folded completion; raises MalformedCompletion if the stream ended before ``[DONE]``."""
        if not self.done:
            raise MalformedCompletion("the stream ended before data: [DONE]")
        choices = [
            _choice(
                index,
                "".join(p.text),
                p.finish,
                p.stop,
                tuple(p.ids) if p.ids is not None else None,
                p.columns,
                p.prompt_logprobs,
            )
            for index, p in self._choices.items()
        ]
        usage = self._usage
        if usage == Usage():
            completion = sum(len(c.tokens or ()) for c in choices)
            usage = Usage(0, completion, completion)
        completion_result = _assemble(self._first or {}, choices, usage, shard, model)
        return replace(completion_result, prompt_token_ids=self._prompt_ids)
