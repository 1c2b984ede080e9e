"""The router's requests through the dispatcher, in process (``Router`` + ``serve_router``) over real sim shards.

In process so the test can read the dispatcher's own events (which prompt each attempt belonged to, ejections) and
drive the weights tracker the way a trainer does; the shards are real ``sim-shard`` subprocesses on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from rollout_runtime.dispatch import AttemptEnded, DispatchEvent, ShardEjected
from rollout_runtime.health import ProbeSettings
from rollout_runtime.router import SHARD_HEADER, WEIGHTS_HEADER, Router, RouterConfig, RouterServer, serve_router
from rollout_runtime.shards import LocalShardSource, StaticShardSource
from rollout_runtime.shards.model import Shard, ShardSource
from rollout_runtime.sim import SimFleet
from rollout_runtime.sim.process import ManagedProcess, until
from rollout_runtime.weights import SGLangWeightVersion
from support.deadlines import within
from support.dispatch import ControlledSource

PROBES = ProbeSettings(period_seconds=0.3, timeout_seconds=0.25, failure_threshold=2, success_threshold=1)
STREAM_SHARD = Path(__file__).parent.parent / "support" / "stream_shard.py"
COMPLETION = {"model": "sim-model", "prompt": "What is 2 + 3?", "max_tokens": 4}


@dataclass
class Events:
    attempts: list[AttemptEnded] = field(default_factory=list)
    ejected: list[str] = field(default_factory=list)

    def observe(self, event: DispatchEvent) -> None:
        if isinstance(event, AttemptEnded):
            self.attempts.append(event)
        elif isinstance(event, ShardEjected):
            self.ejected.append(event.shard)


@contextlib.asynccontextmanager
async def routing(source: ShardSource, events: Events, shards: int) -> AsyncIterator[tuple[Router, RouterServer]]:
    async with Router(source, observer=events.observe) as router, serve_router(router) as server:
        await within(router.dispatcher.wait_ready(shards), f"{shards} routable shard(s)")
        yield router, server


async def test_each_request_is_its_own_prompt_so_a_shard_failing_every_request_is_ejected() -> None:
    """Regression: every request was prompt 0 to the dispatcher, so blame pooled unrelated requests' failures (503s
    from two shards for two requests read as one poison prompt: the client got a 502) and never saw one shard fail
    two distinct prompts (a shard answering 503 to everything was never ejected, and kept wasting attempts)."""
    events = Events()
    async with SimFleet(2) as fleet, aiohttp.ClientSession() as http:
        sick, well = fleet.names
        await fleet.set_faults(sick, fail_next=1000, error_status=503)  # /health stays 200: only traffic tells
        async with routing(StaticShardSource(fleet.shards), events, 2) as (_, server):
            statuses, served_by = [], []
            for _ in range(20):
                async with http.post(server.url + "/v1/completions", json=COMPLETION) as response:
                    statuses.append(response.status)
                    served_by.append(response.headers.get(SHARD_HEADER))
        sick_stats = await fleet.stats(sick)

    assert sick_stats.get("errors_503", 0) >= 1, "no request reached the sick shard: the fault never hit"
    assert statuses == [200] * len(statuses), statuses
    assert set(served_by) == {well}
    assert set(events.ejected) == {sick}, f"the sick shard was not ejected after {len(statuses)} requests"
    prompts = {event.prompt_id for event in events.attempts}
    assert len(prompts) == len(statuses), f"{len(statuses)} requests were {len(prompts)} prompt(s) to the dispatcher"


@pytest.mark.parametrize("status", [401, 403, 404, 407])
async def test_a_shard_answering_401_while_another_serves_is_ejected_and_no_client_gets_its_answer(status: int) -> None:
    """A 401 is DATA by its status (the router relays a shard's 4xx), but never the prompt's: one shard answering it
    while another serves is a sick shard, and the request goes to the other one, from the first request on."""
    events = Events()
    async with SimFleet(2) as fleet, aiohttp.ClientSession() as http:
        sick, well = fleet.names
        await fleet.set_faults(sick, fail_next=1000, error_status=status)
        async with routing(StaticShardSource(fleet.shards), events, 2) as (_, server):
            statuses, served_by = [], []
            for index in range(20):
                body = {**COMPLETION, "prompt": f"What is {index} + 1?"}
                async with http.post(server.url + "/v1/completions", json=body) as response:
                    statuses.append(response.status)
                    served_by.append(response.headers.get(SHARD_HEADER))
        sick_stats = await fleet.stats(sick)

    assert sick_stats.get(f"errors_{status}", 0) >= 2, f"the sick shard answered {status} to fewer than two requests"
    assert statuses == [200] * len(statuses), statuses
    assert set(served_by) == {well}
    assert set(events.ejected) == {sick}, f"the sick shard was not ejected after {len(statuses)} requests"


async def _refit(fleet: SimFleet, source: LocalShardSource, http: aiohttp.ClientSession, version: int) -> None:
    async def update(name: str) -> None:
        body = {"model_path": f"/ckpt/step-{version}", "weight_version": str(version)}
        async with http.post(f"{fleet.shard(name).endpoint}/update_weights_from_disk", json=body) as response:
            assert response.status == 200, await response.text()

    await source.weights.publish(version)
    assert await within(source.weights.refit_all(version, update), f"the refit to {version}") == {}


async def _shard_version(fleet: SimFleet, http: aiohttp.ClientSession, name: str) -> str:
    async with http.get(f"{fleet.shard(name).endpoint}/weight_version") as response:
        return str((await response.json())["weight_version"])


async def test_the_weights_version_header_is_the_dispatchers_for_answers_and_streams() -> None:
    events = Events()
    async with SimFleet(2) as fleet, aiohttp.ClientSession() as http:
        source = LocalShardSource(fleet.shards, PROBES, identity=SGLangWeightVersion())
        async with routing(source, events, 2) as (router, server):
            seen: dict[int, list[tuple[str, str, str]]] = {}
            for version in (1, 2):
                await _refit(fleet, source, http, version)
                await within(router.dispatcher.wait_ready(2), f"both shards routable at version {version}")
                for stream in (False, True):
                    body = {**COMPLETION, "stream": stream}
                    async with http.post(server.url + "/v1/completions", json=body) as response:
                        text = await within(response.text(), f"the answer (stream={stream})")
                        assert response.status == 200, text
                        shard, header = response.headers[SHARD_HEADER], response.headers[WEIGHTS_HEADER]
                    if stream:
                        assert text.rstrip().endswith("data: [DONE]"), text
                    else:
                        assert json.loads(text)["choices"], text
                    shard_says = await within(_shard_version(fleet, http, shard), f"{shard}'s own version")
                    seen.setdefault(version, []).append((header, shard_says, shard))

    for version, answers in seen.items():
        assert len(answers) == 2  # one answer, one stream
        for header, shard_says, shard in answers:
            assert header == str(version), f"{shard} answered with header {header} at version {version}"
            assert shard_says == str(version), f"{shard} itself serves {shard_says}"


async def _stream_shard(tmp_path: Path, name: str) -> tuple[ManagedProcess, Shard]:
    argv = [sys.executable, "-P", str(STREAM_SHARD), "--chunks", "3"]
    process = ManagedProcess(name, argv, tmp_path / f"{name}.log")
    process.start()
    ready = await process.wait_ready_line("STREAM_SHARD_READY ", 30)
    return process, Shard(name=name, endpoint=f"http://127.0.0.1:{ready['port']}")


async def test_a_stream_whose_opener_fails_after_prepare_ends_with_the_error_event_not_a_second_response(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a failure after the client's headers went out (inside the opener) was answered with a JSON
    502 on the same response, and blamed on the shard. Now the stream ends with the router's error event, is
    counted, and the shard (which did nothing wrong) stays routable."""
    injected: list[str] = []
    open_stream = Router.open_stream

    async def open_then_fail(self: Router, request: web.BaseRequest, response: web.StreamResponse) -> None:
        await open_stream(self, request, response)  # the head is out
        if not injected:  # the router's stream to its client, once
            injected.append(response.headers[SHARD_HEADER])
            raise RuntimeError("injected: the opener failed after the head went out")

    events = Events()
    process, shard = await _stream_shard(tmp_path, "stream-a")
    try:
        async with routing(StaticShardSource([shard]), events, 1) as (router, server), aiohttp.ClientSession() as http:
            monkeypatch.setattr(Router, "open_stream", open_then_fail)
            body = {**COMPLETION, "stream": True}
            async with http.post(server.url + "/v1/completions", json=body) as response:
                status, content_type = response.status, response.headers["Content-Type"]
                raw = await within(response.read(), "the broken stream's end")
            async with http.post(server.url + "/v1/completions", json=body) as response:
                after = response.status, await within(response.read(), "the next stream")
            interrupted = router.registry.get_sample_value(
                "router_streams_interrupted_total", {"fleet": "local", "namespace": ""}
            )
    finally:
        process.kill()

    assert injected == ["stream-a"], "the fault never hit the router's stream"
    assert (status, content_type) == (200, "text/event-stream")
    assert raw.count(b"event: error") == 1, raw
    assert b"upstream_error" not in raw, f"a JSON answer followed the stream: {raw!r}"
    assert b"HTTP/1.1" not in raw, f"a second response followed the stream: {raw!r}"
    payload = json.loads(raw[raw.index(b"event: error") :].split(b"data: ", 1)[1])
    assert payload["error"]["type"] == "stream_interrupted"
    assert "injected" in payload["error"]["message"]
    assert interrupted == 1
    assert events.ejected == [], "the shard was blamed for the router's own failure"
    assert after[0] == 200
    assert after[1].rstrip().endswith(b"data: [DONE]")


async def test_a_request_whose_shards_all_leave_mid_request_is_409_and_the_router_keeps_serving() -> None:
    """The healthy set empties while a request is on a shard: that request waits its healthy wait, then answers
    409 with the reason (it used to escape the handler as a 500), and the next request is served as usual."""
    async with SimFleet(1) as fleet, aiohttp.ClientSession() as http:
        shard = fleet.shards[0]
        source = ControlledSource([shard])
        config = RouterConfig(healthy_wait_seconds=0.1)
        async with Router(source, config) as router, serve_router(router) as server:
            await within(router.dispatcher.wait_ready(1), "the shard routable")
            await fleet.set_faults(shard.name, hang=True)
            request = asyncio.ensure_future(http.post(server.url + "/v1/completions", json=COMPLETION))

            async def on_the_shard() -> bool:
                return (await fleet.stats(shard.name)).get("hung", 0) >= 1

            await until(on_the_shard, timeout_seconds=30, what="the request hung on the shard")
            source.publish([])  # the shard leaves: its attempt is evicted and no shard is left to retry on
            async with await within(request, "the answer with no shard left") as response:
                stranded = response.status, await response.json()
            await fleet.clear_faults()
            source.publish([shard])
            await within(router.dispatcher.wait_ready(1), "the shard routable again")
            async with http.post(server.url + "/v1/completions", json=COMPLETION) as response:
                after = response.status
    assert stranded[0] == 409, stranded
    assert stranded[1]["error"]["type"] == "no_healthy_shard"
    assert "no healthy shard" in stranded[1]["error"]["message"]
    assert after == 200, "the router stopped serving after one request found no shard"


async def test_a_fleet_judged_misconfigured_relays_the_shards_own_4xx_and_the_router_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every shard answering 401 is a misconfigured-fleet verdict (a run-terminal error): it used to end the request
    as a 500 from the handler; now each request still gets the shard's own answer, and the router recovers."""
    async with SimFleet(2) as fleet, aiohttp.ClientSession() as http:
        for name in fleet.names:
            await fleet.set_faults(name, fail_next=1000, error_status=401)
        async with routing(StaticShardSource(fleet.shards), Events(), 2) as (_, server):
            answers = []
            for index in range(12):
                body = {**COMPLETION, "prompt": f"What is {index} + 1?"}
                async with http.post(server.url + "/v1/completions", json=body) as response:
                    answers.append((response.status, await response.json()))
            await fleet.clear_faults()
            async with http.post(server.url + "/v1/completions", json=COMPLETION) as response:
                after = response.status
        rejected = sum([(await fleet.stats(name)).get("errors_401", 0) for name in fleet.names])

    assert rejected >= 12, "the shards did not answer 401: the fault never hit"
    verdicts = [r for r in caplog.records if "every shard answers 401" in r.getMessage()]
    assert verdicts, "the dispatcher never judged the fleet misconfigured: the case under test did not happen"
    assert [status for status, _ in answers] == [401] * 12, answers
    assert all("injected fault" in body["error"]["message"] for _, body in answers), answers
    assert after == 200, "the router stopped serving after the misconfigured verdict"


@pytest.mark.parametrize("kind", ["truncated", "no_choices", "error_object"])
async def test_a_200_that_is_not_a_completion_is_redispatched_and_counts_against_its_shard(kind: str) -> None:
    """The router judges a shard's 200 as the generation client does before relaying it: a body that is not a
    completion (JSON cut short, ``choices: []``, an error object inside a 200) is never relayed as a success; the
    request goes to another shard, and the shard answering such bodies is ejected as the library's dispatcher ejects
    it."""
    events = Events()
    async with SimFleet(2) as fleet, aiohttp.ClientSession() as http:
        sick, well = fleet.names
        await fleet.set_faults(sick, not_a_completion_next=1000, not_a_completion=kind)
        async with routing(StaticShardSource(fleet.shards), events, 2) as (_, server):
            answers = []
            for index in range(20):
                body = {**COMPLETION, "prompt": f"What is {index} + 1?", "stream": index % 2 == 1}
                async with http.post(server.url + "/v1/completions", json=body) as response:
                    text = await within(response.text(), f"answer {index}")
                    answers.append((response.status, response.headers.get(SHARD_HEADER), body["stream"], text))
        sick_stats = await fleet.stats(sick)

    assert sick_stats.get(f"not_a_completion_{kind}", 0) >= 1, "no request reached the sick shard: the fault never hit"
    assert [(status, shard) for status, shard, _, _ in answers] == [(200, well)] * len(answers), answers
    for _, _, stream, text in answers:
        if stream:
            assert text.rstrip().endswith("data: [DONE]"), text
            assert "injected" not in text
        else:
            assert json.loads(text)["choices"][0]["text"], text
    failed_there = [e for e in events.attempts if e.shard == sick and e.outcome != "success"]
    assert failed_there, "no attempt on the sick shard was counted as failed"
    assert set(events.ejected) == {sick}, "the shard answering 200s that are not completions was not ejected"


async def test_requests_past_a_shards_cap_wait_at_the_router_instead_of_storming_it() -> None:
    """A shard that takes 2 requests at once and answers 429 (Retry-After: 60) past them: the router learns its
    room from the first 429s and queues the rest, so once learned, no request is refused (no probe is due within the
    Retry-After) and every request is answered."""
    async with SimFleet(1, extra_args=("--slow", "0.05")) as fleet, aiohttp.ClientSession() as http:
        (name,) = fleet.names
        await fleet.set_faults(name, max_concurrent=2, busy_retry_after_seconds=60)
        async with routing(StaticShardSource(fleet.shards), Events(), 1) as (router, server):

            async def ask(index: int) -> int:
                body = {**COMPLETION, "prompt": f"What is {index} + 1?"}
                async with http.post(server.url + "/v1/completions", json=body) as response:
                    await within(response.read(), f"answer {index}")
                    return response.status

            first = await within(asyncio.gather(*(ask(i) for i in range(8))), "the first wave")
            learned = router.dispatcher.gate.room.limit(name)
            busy_first = (await fleet.stats(name)).get("errors_429", 0)
            second = await within(asyncio.gather(*(ask(i) for i in range(16))), "the second wave")
            stats = await fleet.stats(name)

    assert first == [200] * 8
    assert second == [200] * 16
    assert busy_first >= 1, "the shard never refused a request: its cap was never reached"
    assert learned == 2
    assert stats.get("errors_429", 0) == busy_first, "requests were sent past the learned room"
    assert stats["max_generating"] == 2
