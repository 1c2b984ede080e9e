"""Fuzz the environment server's request parsing over real HTTP: any body gets a JSON answer, never a stack trace.

The arithmetic verifier (a real ``BaseEnvironmentServer`` on 127.0.0.1) is sent arbitrary bytes, arbitrary JSON, and
objects shaped like its episode request with fuzzed field values, on every route that reads a body. Its
``generation_url`` only ever points at a refused 127.0.0.1 port, so nothing leaves the machine.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_runtime.environment import EnvironmentServerConfig, EpisodeResponse
from rollout_runtime.sim.environments import ArithmeticVerifier
from support.chaos import write_tally
from support.httpserver import refused_url

TALLY: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def fuzz_report() -> Iterator[None]:
    yield
    write_tally("fuzz-environment", TALLY)


FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
LIMIT = 64 * 1024
REFUSED = refused_url()
TRACE_MARKERS = ("Traceback", 'File "', "site-packages", '.py", line')


@pytest.fixture
async def verifier() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    server = ArithmeticVerifier(EnvironmentServerConfig(max_request_bytes=LIMIT))
    running = await server.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            yield running.url, session
    finally:
        await running.stop()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)
field_values = st.one_of(
    json_values,
    st.text(max_size=300),
    st.integers(-(2**70), 2**70),
    st.sampled_from(["17 + 25", "1 * -3", "9999999999 * 9999999999", "", "  ", "\x00", "1 / 0", "eval('1')"]),
    st.sampled_from([REFUSED, "ftp://127.0.0.1/x", "http://", "javascript:alert(1)", "file:///etc/passwd"]),
)
episode_shaped = st.dictionaries(
    st.sampled_from(["episode_id", "problem", "answer", "generation_url", "model", "unknown", "reward"]),
    field_values,
    max_size=6,
)
bodies = st.one_of(
    st.binary(max_size=2048),
    json_values.map(lambda v: json.dumps(v).encode()),
    episode_shaped.map(lambda d: json.dumps(d).encode()),
    st.integers(1, 40).map(lambda depth: ("[" * depth * 50 + "]" * depth * 50).encode()),  # deep nesting
)


def _no_trace(text: str) -> None:
    for marker in TRACE_MARKERS:
        assert marker not in text, f"stack trace material ({marker!r}) reached the client: {text[:300]}"


@FUZZ
@given(body=bodies, path=st.sampled_from(["/run", "/aggregate_metrics"]), content_type=st.sampled_from(
    ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]))  # fmt: skip
async def test_any_request_body_gets_a_json_answer_and_never_a_stack_trace(
    verifier: tuple[str, aiohttp.ClientSession], body: bytes, path: str, content_type: str
) -> None:
    """For any body on any body-reading route: 200 with a valid reply, or a 4xx JSON error naming the problem
    (400 malformed, 413 too large, 422 schema); never a 5xx, never a stack trace; the server keeps serving."""
    TALLY["test_any_request_body_gets_a_json_answer_and_never_a_stack_trace"] += 1
    url, session = verifier
    headers = {"Content-Type": content_type} if content_type else {}
    async with session.post(url + path, data=body, headers=headers) as response:
        status, text = response.status, await response.text()
    _no_trace(text)
    payload: Any = json.loads(text)
    assert status in (200, 400, 413, 422), (status, text[:300])
    if status == 200:
        if path == "/run":
            reply = EpisodeResponse.model_validate(payload)
            assert reply.reward is not None or reply.failure is not None
        else:
            assert "tasks" in payload
    else:
        assert payload["error"]["status"] == status
        assert isinstance(payload["error"]["message"], str)
        assert payload["error"]["message"]


async def test_the_server_still_serves_after_the_fuzzing(verifier: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = verifier
    for body in (b"\xff" * 100, b"{", json.dumps({"problem": "2 * 3", "answer": "6"}).encode()):
        async with session.post(url + "/run", data=body) as response:
            await response.read()
    async with session.post(url + "/run", json={"problem": "2 * 3", "answer": "the answer is 6"}) as response:
        assert response.status == 200
        assert (await response.json())["reward"] == 1.0
    async with session.get(url + "/health") as response:
        assert response.status == 200


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "GET"])
async def test_wrong_methods_and_paths_are_json_errors_without_traces(
    verifier: tuple[str, aiohttp.ClientSession], method: str
) -> None:
    url, session = verifier
    for path in ("/run", "/nope", "/../../etc/passwd", "/%00", "/checkpoint/open"):
        async with session.request(method, url + path) as response:
            text = await response.text()
        _no_trace(text)
        assert response.status in (404, 405, 409), (method, path, response.status)
        assert json.loads(text)["error"]["status"] == response.status


async def test_deeply_nested_json_is_a_400_not_an_internal_error(verifier: tuple[str, aiohttp.ClientSession]) -> None:
    """Regression (found by the fuzzer): 2,000 levels of brackets made json.loads raise RecursionError -> HTTP 500."""
    url, session = verifier
    async with session.post(url + "/run", data=b"[" * 2000 + b"]" * 2000) as response:
        assert response.status == 400
        assert (await response.json())["error"]["message"] == "the request body is nested too deeply"
