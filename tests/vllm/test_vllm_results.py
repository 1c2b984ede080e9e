"""Every typed-result field, parsed from real vLLM answers (completions and chat, whole and streamed).

The shared servers (tests/support/vllm.py) serve the tiny random-weight model; its text is gibberish, but every
field is vLLM's own: token ids that round-trip as a prompt, logprobs aligned with them, the prompt's logprobs, n
choices, finish reasons and usage that add up.
"""

from __future__ import annotations

import math

from rollout_runtime.generation import GenerationClient, GenerationOptions
from rollout_runtime.shards import Shard
from rollout_runtime.vllm import MAX_MODEL_LEN, MODEL_NAME, VllmServer

NO_EOS = {"ignore_eos": True}
"""The random model may sample its end-of-text token; lengths are asserted, so it must not stop early."""


def shard_of(server: VllmServer) -> Shard:
    return Shard(name=server.name, endpoint=server.url, model=MODEL_NAME)


async def test_completion_fields_token_ids_logprobs_prompt_logprobs_and_n(vllm_shared: list[VllmServer]) -> None:
    options = GenerationOptions(n=2, logprobs=1, prompt_logprobs=1, token_ids=True)
    async with GenerationClient(timeout_seconds=60) as client:
        completion = await client.complete(
            shard_of(vllm_shared[0]),
            "the cat",
            max_tokens=5,
            temperature=1.0,
            options=options,
            extra=NO_EOS | {"seed": 7},
        )
    assert completion.model == MODEL_NAME
    assert completion.shard == vllm_shared[0].name
    assert len(completion.choices) == 2
    assert [choice.index for choice in completion.choices] == [0, 1]
    prompt_ids = completion.prompt_token_ids
    assert prompt_ids is not None
    assert len(prompt_ids) == completion.prompt_tokens
    for choice in completion.choices:
        assert choice.finish_reason == "length"
        assert choice.token_ids is not None
        assert len(choice.token_ids) == 5
        assert choice.logprobs is not None
        assert len(choice.logprobs) == 5
        assert all(lp is not None and lp <= 0.0 and math.isfinite(lp) for lp in choice.logprobs)
        assert choice.prompt_logprobs is not None
        assert len(choice.prompt_logprobs) == len(prompt_ids)
        assert choice.prompt_logprobs[0] is None, "the first prompt token has no logprob"
        for position, token in enumerate(prompt_ids[1:], start=1):
            logprobs = choice.prompt_logprobs[position]
            assert logprobs is not None
            assert token in logprobs, "each prompt token's own logprob is listed"
    assert completion.usage.completion_tokens == 10, "usage counts both choices"
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


async def test_token_ids_round_trip_as_a_prompt_and_a_seed_repeats_across_servers(
    vllm_shared: list[VllmServer],
) -> None:
    options = GenerationOptions(token_ids=True)
    seeded = NO_EOS | {"seed": 11}
    async with GenerationClient(timeout_seconds=60) as client:
        first = await client.complete(
            shard_of(vllm_shared[0]), "a dog", max_tokens=6, temperature=1.0, options=options, extra=seeded
        )
        other = await client.complete(
            shard_of(vllm_shared[1]), "a dog", max_tokens=6, temperature=1.0, options=options, extra=seeded
        )
        assert first.prompt_token_ids is not None
        by_ids = await client.complete(
            shard_of(vllm_shared[1]), list(first.prompt_token_ids), max_tokens=6, temperature=1.0, extra=seeded
        )
    assert first.token_ids == other.token_ids, "same weights, same seed: the same tokens on another server"
    assert by_ids.text == first.text, "a prompt given as its token ids is the same prompt"


async def test_streaming_folds_into_the_same_fields_with_a_usage_chunk(vllm_shared: list[VllmServer]) -> None:
    shard = shard_of(vllm_shared[0])
    async with GenerationClient(timeout_seconds=60) as client:
        whole = await client.complete(
            shard, "it is", max_tokens=8, options=GenerationOptions(token_ids=True), extra=NO_EOS
        )
        streamed = await client.complete(
            shard, "it is", max_tokens=8, options=GenerationOptions(token_ids=True, stream=True), extra=NO_EOS
        )
    assert streamed.text == whole.text, "greedy: the stream assembles the same text"
    assert streamed.token_ids == whole.token_ids
    assert streamed.finish_reason == whole.finish_reason == "length"
    assert streamed.usage.completion_tokens == 8, "the usage chunk (stream_options.include_usage) was read"
    assert streamed.usage.prompt_tokens == whole.usage.prompt_tokens


async def test_chat_completion_and_chat_stream_with_logprobs(vllm_shared: list[VllmServer]) -> None:
    shard = shard_of(vllm_shared[1])
    messages = [{"role": "user", "content": "what is 2 + 2?"}]
    async with GenerationClient(timeout_seconds=60) as client:
        chat = await client.chat(shard, messages, max_tokens=4, options=GenerationOptions(logprobs=1), extra=NO_EOS)
        streamed = await client.chat(
            shard, messages, max_tokens=4, options=GenerationOptions(stream=True), extra=NO_EOS
        )
    assert chat.finish_reason == "length"
    assert chat.usage.completion_tokens == 4
    assert chat.logprobs is not None
    assert len(chat.logprobs) == 4
    assert chat.choices[0].top_logprobs is not None
    assert len(chat.choices[0].top_logprobs) == 4
    assert streamed.text == chat.text, "greedy chat, whole or streamed"
    assert streamed.usage.completion_tokens == 4


async def test_max_tokens_past_the_context_is_cut_not_refused_when_the_sum_overflows(
    vllm_shared: list[VllmServer],
) -> None:
    """prompt + max_tokens over max_model_len is no error: vLLM cuts max_tokens (finish_reason length)."""
    prompt = " the" * 100
    async with GenerationClient(timeout_seconds=60) as client:
        completion = await client.complete(
            shard_of(vllm_shared[0]), prompt, max_tokens=MAX_MODEL_LEN - 10, extra=NO_EOS
        )
    assert completion.prompt_tokens + MAX_MODEL_LEN - 10 > MAX_MODEL_LEN, "the request really overflowed"
    assert completion.finish_reason == "length"
    assert completion.prompt_tokens + completion.completion_tokens <= MAX_MODEL_LEN
