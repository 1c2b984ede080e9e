"""Typed results: vLLM/OpenAI bodies and SSE streams fold into the same Choice/Completion values."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.results import (
    Completion,
    GenerationOptions,
    MalformedCompletion,
    StreamAssembler,
    parse_completion,
)
from rollout_runtime.sim.tokens import (
    choice_token_fields,
    prompt_logprobs,
    stream_chunks,
    token_id,
    token_logprob,
)


def body(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    return json.dumps({"model": "m", "choices": choices, "usage": usage, **extra}).encode()


def test_vllm_options_map_to_its_own_field_names() -> None:
    options = GenerationOptions(n=4, logprobs=2, prompt_logprobs=0, token_ids=True, stream=True)
    assert options.request_fields(chat=False) == {
        "n": 4,
        "logprobs": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "prompt_logprobs": 0,
    }
    assert options.request_fields(chat=True)["logprobs"] is True
    assert options.request_fields(chat=True)["top_logprobs"] == 2


def test_sglang_dialect_sends_only_openai_fields() -> None:
    options = GenerationOptions(logprobs=1, prompt_logprobs=1, token_ids=True, dialect="sglang")
    assert options.request_fields(chat=False) == {"logprobs": 1}


def test_bad_options_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="n must be >= 1"):
        GenerationOptions(n=0)
    with pytest.raises(ValueError, match="logprobs must be >= 0"):
        GenerationOptions(logprobs=-1)


def test_completion_body_gives_every_choice_with_ids_and_logprobs() -> None:
    logprobs = {"tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.5, -1.0], "top_logprobs": None}
    raw = body(
        [
            {"index": 1, "text": "b", "finish_reason": "length", "logprobs": None},
            {"index": 0, "text": "a b", "finish_reason": "stop", "logprobs": logprobs},
        ]
    )
    completion = parse_completion(raw, chat=False, shard="s1")
    assert [c.index for c in completion.choices] == [0, 1]
    assert (completion.text, completion.finish_reason, completion.shard) == ("a b", "stop", "s1")
    assert completion.token_ids == (5, 9)
    assert completion.logprobs == (-0.5, -1.0)
    assert completion.usage.total_tokens == 5
    assert completion.weights_version is None
    assert completion.choices[1].token_ids is None


def test_chat_body_reads_content_logprobs_and_response_level_prompt_logprobs() -> None:
    content = [{"token": "x", "logprob": -0.1, "top_logprobs": [{"token": "x", "logprob": -0.1}]}]
    raw = body(
        [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop", "logprobs": {"content": content}}],
        prompt_logprobs=[None, {"7": {"logprob": -2.0, "rank": 1}}],
    )
    completion = parse_completion(raw, chat=True, shard="s")
    assert completion.choices[0].tokens == ("x",)
    assert completion.choices[0].top_logprobs == ({"x": -0.1},)
    assert completion.prompt_logprobs == (None, {7: -2.0})


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[]", b'{"choices": []}', b'{"choices": [{"text": 3}]}', b'{"choices": [{"index": "x"}]}'],
)
def test_a_body_that_is_not_a_completion_is_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedCompletion):
        parse_completion(raw, chat=False, shard="s")


def _sim_body(words: list[str], request: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": " ".join(words)}
    else:
        choice["text"] = " ".join(words)
        if request.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = prompt_logprobs("p q r")
    choice.update(choice_token_fields(request, words, chat=chat))
    usage = {"prompt_tokens": 3, "completion_tokens": len(words), "total_tokens": 3 + len(words)}
    return {"id": "x", "created": 0, "model": "m", "choices": [choice], "usage": usage}


@given(
    words=st.lists(st.text(alphabet="abcxyz", min_size=1, max_size=5), min_size=1, max_size=12),
    chat=st.booleans(),
    top=st.integers(min_value=0, max_value=3),
    as_ids=st.booleans(),
)
def test_a_stream_folds_into_the_same_result_as_the_body(words: list[str], chat: bool, top: int, as_ids: bool) -> None:
    """Invariant: for any answer, the streamed chunks and the one body give equal choices and usage."""
    request: dict[str, Any] = {"return_token_ids": True, "return_tokens_as_token_ids": as_ids}
    if chat:
        request |= {"logprobs": True, "top_logprobs": top}
    else:
        request |= {"logprobs": top, "prompt_logprobs": 0}
    whole = _sim_body(words, request, chat=chat)
    expected = parse_completion(whole, chat=chat, shard="s")
    envelope = whole | {"_prompt_logprobs": whole["choices"][0].get("prompt_logprobs")}
    assembler = StreamAssembler(chat=chat)
    tokens = 0
    for chunk in stream_chunks(envelope, [(words, "stop")], request, chat=chat, usage=whole["usage"]):
        tokens += assembler.add(json.dumps(chunk))
    assembler.add("[DONE]")
    streamed = assembler.result(shard="s")
    assert tokens == len(words)
    assert streamed.choices == expected.choices
    assert streamed.usage == expected.usage
    assert streamed.token_ids == tuple(token_id(w) for w in words)
    assert streamed.logprobs == tuple(token_logprob(w) for w in words)


def test_a_stream_without_done_is_not_a_result() -> None:
    assembler = StreamAssembler(chat=False)
    assembler.add(json.dumps({"choices": [{"index": 0, "text": "a"}]}))
    with pytest.raises(MalformedCompletion, match=r"before data: \[DONE\]"):
        assembler.result(shard="s")


def test_an_error_event_in_a_stream_is_malformed() -> None:
    with pytest.raises(MalformedCompletion, match="error"):
        StreamAssembler(chat=True).add(json.dumps({"error": {"message": "boom"}}))


def test_completion_keeps_its_old_constructor() -> None:
    completion = Completion("t", "stop", 1, 1, "m", "s")
    assert completion.token_ids is None
    assert completion.choices == ()


def test_prompt_token_ids_are_read_where_vllm_puts_them() -> None:
    """vLLM 0.32 sends a completion's prompt ids in each choice (``choices[].prompt_token_ids``) and a chat's at the
    top level; both are the Completion's ``prompt_token_ids`` (found by the real-vLLM tier, tests/vllm)."""
    per_choice = {
        "model": "m",
        "choices": [{"index": 0, "text": "a", "finish_reason": "length", "prompt_token_ids": [5, 6]}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1},
    }
    top_level = {
        "model": "m",
        "prompt_token_ids": [7],
        "choices": [{"index": 0, "message": {"content": "b"}, "finish_reason": "stop"}],
    }
    assert parse_completion(per_choice, chat=False, shard="s").prompt_token_ids == (5, 6)
    assert parse_completion(top_level, chat=True, shard="s").prompt_token_ids == (7,)
    assembler = StreamAssembler(chat=False)
    assembler.add(json.dumps({"choices": [{"index": 0, "text": "a", "prompt_token_ids": [5, 6]}]}))
    assembler.add(json.dumps({"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}))
    assembler.add("[DONE]")
    assert assembler.result(shard="s", model="m").prompt_token_ids == (5, 6)


@pytest.mark.parametrize("chat", [False, True])
def test_an_aborted_generation_is_not_a_completion_whole_or_streamed(chat: bool) -> None:
    """vLLM answers 200 with finish_reason "abort" and the tokens so far when it is paused with mode=abort or shut
    down (measured on SIGTERM in tests/vllm): a cut-off sample must never be a result, whole or streamed."""
    content = {"message": {"role": "assistant", "content": "half an ans"}} if chat else {"text": "half an ans"}
    aborted = [{"index": 0, "finish_reason": "abort", **content}]
    with pytest.raises(MalformedCompletion, match="aborted"):
        parse_completion(body(aborted), chat=chat, shard="s")
    delta = {"delta": {"content": "half"}} if chat else {"text": "half"}
    assembler = StreamAssembler(chat=chat)
    assembler.add(json.dumps({"choices": [{"index": 0, **delta}]}))
    assembler.add(json.dumps({"choices": [{"index": 0, "finish_reason": "abort", **delta}]}))
    assembler.add("[DONE]")
    with pytest.raises(MalformedCompletion, match="aborted"):
        assembler.result(shard="s")
    finished = [{"index": 0, "finish_reason": "length", **content}]
    assert parse_completion(body(finished), chat=chat, shard="s").finish_reason == "length"
