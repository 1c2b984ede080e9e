"""The verdict on the start of a 200 stream (``judge_stream_start``): the generation client's folding of a stream,
applied to its first events, as the router applies it before relaying a stream."""

from __future__ import annotations

import pytest

from rollout_runtime.failures import GenerationUnavailable
from rollout_runtime.generation import judge_stream_start
from rollout_runtime.shards.model import Shard

SHARD = Shard(name="s", endpoint="http://127.0.0.1:1")
CHOICE = b'data: {"choices": [{"index": 0, "text": "4"}]}'


@pytest.mark.parametrize(
    ("lines", "started"),
    [
        ([CHOICE, b""], True),
        ([b": ping", b""], False),  # no data yet: read on
        ([b'data: {"choices": [], "usage": {"prompt_tokens": 3}}', b""], False),  # a usage-only chunk: read on
        ([b'data: {"choices": []}', b"", CHOICE, b""], True),
    ],
)
def test_a_stream_starting_with_a_choice_or_no_data_yet_is_not_failed(lines: list[bytes], started: bool) -> None:
    assert judge_stream_start(SHARD, lines, chat=False) is started


@pytest.mark.parametrize(
    "lines",
    [
        [b'data: {"error": {"message": "overloaded"}}', b""],
        [b'data: {"choices": [{"index": 0, "te', b""],
        [b'data: {"choices": []}', b"", b"data: [DONE]", b""],
    ],
    ids=["error-object", "truncated", "done-before-any-choice"],
)
def test_a_stream_whose_first_event_is_not_a_completion_is_a_200_failure(lines: list[bytes]) -> None:
    with pytest.raises(GenerationUnavailable, match="not a completion") as caught:
        judge_stream_start(SHARD, lines, chat=False)
    assert caught.value.status == 200
