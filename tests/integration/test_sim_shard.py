"""The simulated shard, in process: the OpenAI subset, vLLM's errors, and faults switched at run time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_runtime.sim import SimShardConfig, create_app, expected_answer, vllm_context_length_message
from rollout_runtime.sim.shard import SimShard
from support.httpserver import serve

MODEL = "sim-model"


@pytest.fixture
async def shard_url() -> AsyncIterator[str]:
    async with serve(create_app(SimShardConfig(model=MODEL, max_model_len=64, max_body_bytes=4096))) as url:
        yield url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: object) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body) as response:
        return response.status, await response.json()


async def test_health_answers_200_with_an_empty_body(http: aiohttp.ClientSession, shard_url: str) -> None:
    async with http.get(shard_url + "/health") as response:
        assert (response.status, await response.read()) == (200, b"")


async def test_models_lists_the_served_model_with_its_max_model_len(
    http: aiohttp.ClientSession, shard_url: str
) -> None:
    async with http.get(shard_url + "/v1/models") as response:
        body = await response.json()
    assert body["object"] == "list"
    assert [(m["id"], m["max_model_len"]) for m in body["data"]] == [(MODEL, 64)]


async def test_completion_answers_arithmetic_and_reports_usage(http: aiohttp.ClientSession, shard_url: str) -> None:
    status, body = await post(
        http, shard_url + "/v1/completions", {"model": MODEL, "prompt": "What is 12 * 7?", "max_tokens": 8}
    )
    assert status == 200
    assert body["object"] == "text_completion"
    assert body["choices"] == [
        {"index": 0, "text": "84", "logprobs": None, "finish_reason": "stop", "stop_reason": None}
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}


async def test_completion_stops_at_max_tokens_with_finish_reason_length(
    http: aiohttp.ClientSession, shard_url: str
) -> None:
    status, body = await post(http, shard_url + "/v1/completions", {"prompt": "one two three four", "max_tokens": 2})
    assert status == 200
    assert body["choices"][0]["text"] == "one two"
    assert body["choices"][0]["finish_reason"] == "length"


async def test_chat_answers_the_last_user_message(http: aiohttp.ClientSession, shard_url: str) -> None:
    status, body = await post(
        http,
        shard_url + "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "reverse: a b c"}]},
            ],
        },
    )
    assert status == 200
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "c b a"}
    assert body["usage"]["prompt_tokens"] == 6


async def test_over_long_request_gets_vllms_exact_400(http: aiohttp.ClientSession, shard_url: str) -> None:
    status, body = await post(http, shard_url + "/v1/completions", {"prompt": "w " * 60, "max_tokens": 10})
    assert status == 400
    assert body == {
        "error": {
            "message": "This model's maximum context length is 64 tokens. However, you requested 70 tokens "
            "(60 in the messages, 10 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }


async def test_over_long_chat_without_max_tokens_gets_the_messages_only_wording(
    http: aiohttp.ClientSession, shard_url: str
) -> None:
    status, body = await post(
        http, shard_url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "w " * 64}]}
    )
    assert status == 400
    assert body["error"]["message"] == vllm_context_length_message(64, 64, None)
    assert "64 tokens in the messages, Please reduce the length of the messages." in str(body["error"]["message"])


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"prompt": 5}', "prompt must be"),
        (b'{"prompt": "x", "max_tokens": -1}', "max_tokens must be"),
    ],
)
async def test_bad_requests_get_a_json_400_never_a_stack_trace(
    http: aiohttp.ClientSession, shard_url: str, raw: bytes, complaint: str
) -> None:
    async with http.post(shard_url + "/v1/completions", data=raw) as response:
        body = await response.json(content_type=None)
    assert response.status == 400
    assert body["error"]["code"] == 400
    assert complaint in body["error"]["message"]
    assert "Traceback" not in json.dumps(body)


async def test_oversized_request_body_is_refused_with_a_json_413(http: aiohttp.ClientSession, shard_url: str) -> None:
    async with http.post(shard_url + "/v1/completions", json={"prompt": "x" * 10_000}) as response:
        body = await response.json(content_type=None)
    assert (response.status, body["error"]["code"]) == (413, 413)


async def test_a_request_for_another_model_gets_vllms_404(http: aiohttp.ClientSession, shard_url: str) -> None:
    status, body = await post(http, shard_url + "/v1/completions", {"model": "gpt-9", "prompt": "hi"})
    assert (status, body["error"]["type"]) == (404, "NotFoundError")
    assert body["error"]["message"] == "The model `gpt-9` does not exist."


async def test_error_burst_fails_the_next_requests_then_recovers(http: aiohttp.ClientSession, shard_url: str) -> None:
    status, faults = await post(http, shard_url + "/admin/faults", {"fail_next": 2, "error_status": 429})
    assert (status, faults["fail_next"], faults["error_status"]) == (200, 2, 429)
    statuses = [(await post(http, shard_url + "/v1/completions", {"prompt": "hi"}))[0] for _ in range(3)]
    assert statuses == [429, 429, 200]


async def test_error_rate_one_fails_every_request_with_the_chosen_status(
    http: aiohttp.ClientSession, shard_url: str
) -> None:
    await post(http, shard_url + "/admin/faults", {"error_rate": 1.0})
    status, body = await post(http, shard_url + "/v1/completions", {"prompt": "hi"})
    assert (status, body["error"]["code"]) == (503, 503)


async def test_garble_rate_one_answers_200_with_garbage_to_the_token_limit(
    http: aiohttp.ClientSession, shard_url: str
) -> None:
    """A gray failure: the body is a well-formed completion, only its content is wrong."""
    _, clean = await post(http, shard_url + "/v1/completions", {"prompt": "What is 6 * 7?", "max_tokens": 8})
    assert (clean["choices"][0]["text"], clean["choices"][0]["finish_reason"]) == ("42", "stop")
    await post(http, shard_url + "/admin/faults", {"garble_rate": 1.0})
    status, body = await post(http, shard_url + "/v1/completions", {"prompt": "What is 6 * 7?", "max_tokens": 8})
    choice = body["choices"][0]
    assert status == 200
    assert choice["finish_reason"] == "length"
    assert len(choice["text"].split()) == 8
    assert "42" not in choice["text"].split()
    assert body["usage"]["completion_tokens"] == 8
    async with http.get(shard_url + "/admin/stats") as response:
        assert (await response.json())["garbled"] == 1


async def test_wrong_model_fault_changes_what_models_lists(http: aiohttp.ClientSession, shard_url: str) -> None:
    await post(http, shard_url + "/admin/faults", {"wrong_model": "llama-3"})
    async with http.get(shard_url + "/v1/models") as response:
        assert [m["id"] for m in (await response.json())["data"]] == ["llama-3"]


async def test_unhealthy_fault_fails_health_only(http: aiohttp.ClientSession, shard_url: str) -> None:
    await post(http, shard_url + "/admin/faults", {"unhealthy": True})
    async with http.get(shard_url + "/health") as response:
        assert response.status == 503
    assert (await post(http, shard_url + "/v1/completions", {"prompt": "hi"}))[0] == 200


async def test_put_replaces_faults_and_invalid_faults_are_refused(http: aiohttp.ClientSession, shard_url: str) -> None:
    await post(http, shard_url + "/admin/faults", {"unhealthy": True, "slow_seconds": 1})
    async with http.put(shard_url + "/admin/faults", json={"fail_next": 1}) as response:
        faults = await response.json()
    assert (faults["unhealthy"], faults["slow_seconds"], faults["fail_next"]) == (False, 0.0, 1)
    status, body = await post(http, shard_url + "/admin/faults", {"error_rate": 2})
    assert status == 400
    assert "error_rate" in str(body["error"]["message"])


async def test_hung_shard_answers_nothing_until_the_hang_is_lifted(http: aiohttp.ClientSession, shard_url: str) -> None:
    await post(http, shard_url + "/admin/faults", {"hang": True})
    pending = asyncio.ensure_future(post(http, shard_url + "/v1/completions", {"prompt": "1 + 1"}))
    while True:  # wait until the server holds the request (an observable state, not a guess at time)
        async with http.get(shard_url + "/admin/stats") as response:
            if (await response.json()).get("hung", 0) >= 1:
                break
    assert not pending.done()
    await post(http, shard_url + "/admin/faults", {"hang": False})
    status, body = await pending
    assert (status, body["choices"][0]["text"]) == (200, "2")


async def test_slow_shard_outlasts_a_short_client_deadline(http: aiohttp.ClientSession, shard_url: str) -> None:
    await post(http, shard_url + "/admin/faults", {"slow_seconds": 60})
    with pytest.raises(TimeoutError):
        async with http.post(
            shard_url + "/v1/completions", json={"prompt": "hi"}, timeout=aiohttp.ClientTimeout(total=0.2)
        ):
            pass


async def test_dropped_response_cuts_the_body_off(http: aiohttp.ClientSession, shard_url: str) -> None:
    await post(http, shard_url + "/admin/faults", {"drop_next": 1})
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(shard_url + "/v1/completions", json={"prompt": "hi"}) as response:
            await response.read()
    assert (await post(http, shard_url + "/v1/completions", {"prompt": "hi"}))[0] == 200


async def test_crash_after_requests_exits_the_process_on_the_nth_request(http: aiohttp.ClientSession) -> None:
    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise ConnectionResetError("process gone")

    shard = SimShard(SimShardConfig(), exit_process=fake_exit)
    async with serve(shard.app()) as url:
        await post(http, url + "/admin/faults", {"crash_after_requests": 2})
        assert (await post(http, url + "/v1/completions", {"prompt": "hi"}))[0] == 200
        with pytest.raises(aiohttp.ClientError):
            await post(http, url + "/v1/completions", {"prompt": "hi"})
    assert exits == [3]


@given(st.text(max_size=80))
def test_expected_answer_is_deterministic_and_never_raises(prompt: str) -> None:
    """Invariant: the sim model's answer is a pure function of the prompt."""
    assert expected_answer(prompt) == expected_answer(prompt)


@given(a=st.integers(-(10**6), 10**6), b=st.integers(-(10**6), 10**6), op=st.sampled_from("+-*"))
def test_expected_answer_computes_arithmetic(a: int, b: int, op: str) -> None:
    """Invariant: "What is a op b?" is answered with the exact integer result."""
    result = a + b if op == "+" else a - b if op == "-" else a * b
    assert expected_answer(f"What is {a} {op} {b}?") == str(result)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=12,
)
request_bodies = st.dictionaries(
    st.sampled_from(
        [
            *("prompt", "messages", "max_tokens", "n", "model", "stream", "temperature", "max_completion_tokens"),
            *("logprobs", "top_logprobs", "prompt_logprobs", "return_token_ids", "stream_options"),
        ]
    ),
    json_values,
    max_size=5,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=request_bodies, path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
async def test_any_json_request_gets_a_completion_or_a_json_client_error(
    http: aiohttp.ClientSession, shard_url: str, body: dict[str, object], path: str
) -> None:
    """Invariant: whatever JSON a client sends, the shard answers 200 or a 4xx in vLLM's error shape; never 5xx."""
    async with http.post(shard_url + path, json=body) as response:
        if response.content_type == "text/event-stream":
            events = (await response.read()).split(b"\n\n")
            assert response.status == 200
            assert events[-2] == b"data: [DONE]"
            return
        payload = await response.json(content_type=None)
    assert response.status == 200 or (400 <= response.status < 500 and "message" in payload["error"])


async def test_flapping_shard_alternates_up_and_down_on_its_clock(http: aiohttp.ClientSession) -> None:
    now = [100.0]
    shard = SimShard(SimShardConfig(), clock=lambda: now[0])
    async with serve(shard.app()) as url:
        await post(http, url + "/admin/faults", {"flap_seconds": 10})
        seen = []
        for t in (100.0, 109.0, 111.0, 119.0, 121.0):
            now[0] = t
            async with http.get(url + "/health") as response:
                health = response.status
            seen.append((health, (await post(http, url + "/v1/completions", {"prompt": "hi"}))[0]))
    assert seen == [(200, 200), (200, 200), (503, 503), (503, 503), (200, 200)]


def test_sim_shard_is_registered_as_a_cli_command() -> None:
    from click.testing import CliRunner

    from rollout_runtime.cli import cli

    result = CliRunner().invoke(cli, ["sim-shard", "--help"])
    assert result.exit_code == 0
    assert "--max-model-len" in result.output
    assert "--flap" in result.output
