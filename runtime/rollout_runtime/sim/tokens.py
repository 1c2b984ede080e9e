"""The sim shard's token-level answers, shaped as vLLM shapes them: token ids, logprobs, prompt logprobs, SSE.

Pure and deterministic: a word's token id is a stable digest of it, its logprob a function of the id, so tests can
compute the expected values (:func:`token_id`, :func:`token_logprob`) and compare a streamed answer with a
non-streamed one field by field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any, Final

__all__ = [
    "VOCAB_SIZE",
    "chat_logprobs",
    "choice_token_fields",
    "completion_logprobs",
    "prompt_logprobs",
    "sse_event",
    "stream_chunks",
    "token_id",
    "token_logprob",
]

VOCAB_SIZE: Final[int] = 32_000


def token_id(word: str) -> int:
    """The sim vocabulary's id for a whitespace token (stable across processes)."""
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big") % VOCAB_SIZE


def token_logprob(word: str) -> float:
    """A deterministic logprob in (-4, 0] for the token."""
    return -((token_id(word) % 4000) / 1000.0)


def _name(word: str, as_ids: bool) -> str:
    return f"token_id:{token_id(word)}" if as_ids else word


def _alternatives(word: str, top: int, as_ids: bool) -> list[tuple[str, float]]:
    """The sampled token first (greedy), then ``top - 1`` made-up lower-probability ones."""
    chosen = (_name(word, as_ids), token_logprob(word))
    others = [(_name(f"{word}#{k}", as_ids), token_logprob(word) - k) for k in range(1, top)]
    return [chosen, *others][:top] if top else []


def completion_logprobs(words: Sequence[str], top: int, *, as_ids: bool, offset: int = 0) -> dict[str, Any]:
    """``/v1/completions``' parallel-list logprobs for ``words`` (text offsets count from ``offset``)."""
    offsets: list[int] = []
    position = offset
    for word in words:
        offsets.append(position)
        position += len(word) + 1
    return {
        "text_offset": offsets,
        "token_logprobs": [token_logprob(w) for w in words],
        "tokens": [_name(w, as_ids) for w in words],
        "top_logprobs": [dict(_alternatives(w, top, as_ids)) for w in words] if top else None,
    }


def chat_logprobs(words: Sequence[str], top: int, *, as_ids: bool) -> dict[str, Any]:
    """``/v1/chat/completions``' ``{"content": [...]}`` logprobs for ``words``."""
    return {
        "content": [
            {
                "token": _name(w, as_ids),
                "logprob": token_logprob(w),
                "bytes": list(w.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in _alternatives(w, top, as_ids)
                ],
            }
            for w in words
        ]
    }


def prompt_logprobs(prompt: str) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: None for the first position, then ``{id: {logprob, rank, decoded_token}}``."""
    words = prompt.split()
    return [None] + [
        {str(token_id(w)): {"logprob": token_logprob(w), "rank": 1, "decoded_token": w}} for w in words[1:]
    ]


def choice_token_fields(body: dict[str, Any], words: Sequence[str], *, chat: bool, offset: int = 0) -> dict[str, Any]:
    """The token-level fields of one choice that the request asked for (vLLM's option names)."""
    fields: dict[str, Any] = {}
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    if chat:
        if body.get("logprobs"):
            top = body.get("top_logprobs") or 0
            fields["logprobs"] = chat_logprobs(words, int(top), as_ids=as_ids)
    elif body.get("logprobs") is not None:
        fields["logprobs"] = completion_logprobs(words, int(body["logprobs"]), as_ids=as_ids, offset=offset)
    if body.get("return_token_ids"):
        fields["token_ids"] = [token_id(w) for w in words]
    return fields


def sse_event(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def stream_chunks(
    envelope: dict[str, Any],
    choices: Sequence[tuple[Sequence[str], str]],
    body: dict[str, Any],
    *,
    chat: bool,
    usage: dict[str, int] | None,
) -> Iterator[dict[str, Any]]:
    """The chunks vLLM streams for ``choices`` (words, finish reason): a token per chunk, choices interleaved,
    the finish reason on each choice's last chunk, then a usage-only chunk when ``include_usage`` was asked."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = {k: envelope[k] for k in ("id", "created", "model")} | {"object": kind}
    if chat:
        for index in range(len(choices)):
            delta = {"role": "assistant", "content": ""}
            yield base | {"choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]}
    longest = max((len(words) for words, _ in choices), default=0)
    for position in range(max(longest, 1)):
        for index, (words, finish) in enumerate(choices):
            if position >= max(len(words), 1):
                continue
            piece = words[position : position + 1]
            text = (" " if position else "") + (piece[0] if piece else "")
            last = position >= len(words) - 1
            choice: dict[str, Any] = {"index": index}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            offset = sum(len(w) + 1 for w in words[:position])
            choice.update(choice_token_fields(body, piece, chat=chat, offset=offset))
            choice.setdefault("logprobs", None)
            choice["finish_reason"] = finish if last else None
            choice["stop_reason"] = None
            if position == 0 and not chat and body.get("prompt_logprobs") is not None:
                choice["prompt_logprobs"] = envelope.get("_prompt_logprobs")
            yield base | {"choices": [choice]}
    if usage is not None:
        yield base | {"choices": [], "usage": usage}
