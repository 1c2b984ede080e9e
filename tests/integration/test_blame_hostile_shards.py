"""Hostile shards as real aiohttp servers on 127.0.0.1, one per behaviour of issue 13, behind the real dispatcher.

Each test proves its fault hit (the hostile servers count what they answered) and that blame followed the evidence:
a sick fleet is not read as bad prompts, a poison prompt is not read as a sick fleet, backpressure is not sickness.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from click.testing import CliRunner

from rollout_runtime.cli.classify import classify
from rollout_runtime.dispatch import Completed, DataFailed, Dispatcher, DispatchPolicy
from rollout_runtime.environment import rollout_failure_for_http_error
from rollout_runtime.failures import FailureClass, RolloutFleetMisconfigured, diagnose
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import Shard
from support.deadlines import within
from support.dispatch import ControlledSource, assert_accounted, by_kind, collect_until_error
from support.httpserver import serve

Handler = Callable[[dict[str, Any]], Awaitable[web.StreamResponse]]
POLICY = DispatchPolicy(
    backoff_initial_seconds=0.01,
    backoff_max_seconds=0.05,
    ejection_base_seconds=60,
    max_concurrency=16,
    max_skipped_prompts=4,  # a poison prompt is reported DataFailed and the run goes on (the default ends it)
    min_step_batch_fraction=0.5,
)
POISON = "the prompt every shard refuses"


def completion(text: str) -> web.Response:
    return web.json_response(
        {"object": "text_completion", "model": "m", "choices": [{"text": text, "finish_reason": "stop"}], "usage": {}}
    )


async def healthy(payload: dict[str, Any]) -> web.StreamResponse:
    if payload.get("prompt") == POISON:  # what llama.cpp does with a request it cannot validate
        return web.json_response({"error": {"message": "Input validation error: bad prompt"}}, status=500)
    return completion(f"done: {payload.get('prompt')}")


def answering(status: int, body: str | bytes, content_type: str = "application/json", **headers: str) -> Handler:
    async def handler(payload: dict[str, Any]) -> web.StreamResponse:
        raw = body.encode() if isinstance(body, str) else body
        return web.Response(status=status, body=raw, content_type=content_type, headers=headers)

    return handler


def error_body(message: str) -> str:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error"}})


HOSTILE: dict[str, Handler] = {
    "401": answering(401, error_body("Invalid API key")),
    "403": answering(403, error_body("Forbidden")),
    "407": answering(407, "Proxy Authentication Required", "text/plain"),
    "404-model": answering(404, error_body("The model `m` does not exist.")),
    "404-path": answering(404, "404: Not Found", "text/plain"),
    "413": answering(413, "Request Entity Too Large", "text/plain"),
    "422": answering(422, error_body("Field required: prompt")),
    "200-invalid-json": answering(200, "{not json"),
    "200-html": answering(200, "<html><body>Please sign in</body></html>", "text/html"),
    "200-no-choices": answering(200, json.dumps({"choices": []})),
    "200-error-object": answering(200, json.dumps({"error": {"message": "engine overloaded"}})),
}


SHARD_OR_FLEET = ["401", "403", "404-model", "404-path", "407"]
"""Answers that say "this shard or this fleet is wrong": DATA by the first verdict, weighed by blame."""
FLEET_ERRORS = {
    "401": "every shard answers 401 Unauthorized: check the API key",
    "403": "every shard answers 403 Forbidden: check the API key's permissions",
    "404-model": "every shard answers 404 Not Found: check the endpoint URL and the model name",
    "404-path": "every shard answers 404 Not Found: check the endpoint URL and the model name",
    "407": "every shard answers 407 Proxy Authentication Required: check the proxy credentials",
}


@asynccontextmanager
async def fleet(handlers: list[Handler]) -> AsyncIterator[tuple[list[Shard], Counter[str]]]:
    """Start one real server per handler; yield the shards and a count of requests each one answered."""
    answered: Counter[str] = Counter()
    async with AsyncExitStack() as stack:
        shards = []
        for index, handler in enumerate(handlers):
            name = f"shard-{index}"

            async def route(request: web.Request, handler: Handler = handler, name: str = name) -> web.StreamResponse:
                answered[name] += 1
                return await handler(await request.json())

            app = web.Application()
            app.router.add_post("/v1/completions", route)
            url = await stack.enter_async_context(serve(app))
            shards.append(Shard(name=name, endpoint=url))
        yield shards, answered


async def dispatch(shards: list[Shard], prompts: list[str], policy: DispatchPolicy = POLICY) -> tuple[Any, ...]:
    async with GenerationClient(timeout_seconds=10) as client, Dispatcher(ControlledSource(shards), policy) as d:

        async def rollout(shard: Shard, prompt: str) -> str:
            return (await client.complete(shard, prompt, max_tokens=4)).text

        run = d.run(prompts, rollout)
        outcomes, error = await collect_until_error(run, seconds=60)
        return outcomes, error, run, d


@pytest.mark.parametrize("behaviour", SHARD_OR_FLEET)
async def test_every_shard_answering_it_ends_the_run_naming_the_cause_within_two_attempts_per_shard(
    behaviour: str,
) -> None:
    async with fleet([HOSTILE[behaviour]] * 4) as (shards, answered):
        outcomes, error, run, _ = await dispatch(shards, [f"p{i}" for i in range(200)])
    assert sum(answered.values()) >= 4, "the fault never hit"
    assert isinstance(error, RolloutFleetMisconfigured)
    assert FLEET_ERRORS[behaviour] in str(error)
    assert [o for o in outcomes if isinstance(o, DataFailed)] == [], "a sick fleet data-failed prompts"
    assert run.stats.attempts <= 2 * len(shards) + POLICY.max_concurrency, "attempts ended before the error"
    assert run.stats.infra_failures + run.stats.data_failures <= 2 * len(shards), "failed attempts before the error"
    assert_accounted(run, outcomes, range(200))


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
async def test_two_hostile_shards_of_four_data_fail_no_prompt_and_are_ejected(behaviour: str) -> None:
    async with fleet([healthy, healthy, HOSTILE[behaviour], HOSTILE[behaviour]]) as (shards, answered):
        outcomes, error, run, dispatcher = await dispatch(shards, [f"p{i}" for i in range(64)])
    assert answered["shard-2"] + answered["shard-3"] >= 1, "the hostile shards were never asked"
    assert error is None
    kinds = by_kind(outcomes)
    assert kinds["data_failed"] == [], [o.reason for o in kinds["data_failed"]]
    assert len(kinds["completed"]) == 64
    assert all(isinstance(o, Completed) and o.shard in {"shard-0", "shard-1"} for o in outcomes)
    hit = {name for name in ("shard-2", "shard-3") if answered[name] >= 2}
    assert hit <= set(dispatcher.ejected), f"a shard that answered {behaviour} to several prompts kept its traffic"
    assert_accounted(run, outcomes, range(64))


HELD_UNTIL = 12
"""Hostile answers before the healthy shards answer anything: half of the first wave (8 of 16 in flight) and the
immediate retries of half of those (4), which land on the other hostile shard: 4 prompts have met both."""


@pytest.mark.parametrize("behaviour", SHARD_OR_FLEET)
async def test_hostile_answers_before_anything_is_served_data_fail_no_prompt(behaviour: str) -> None:
    """A rejected key comes back in a millisecond, a generation in seconds: prompts meet both hostile shards before
    any shard has served anything, when the prompt's data budget (2) alone would data-fail them."""
    gate, unserved = asyncio.Event(), Counter[str]()  # hostile answers per prompt while nothing was served

    async def hostile(payload: dict[str, Any]) -> web.StreamResponse:
        if not gate.is_set():
            unserved[payload["prompt"]] += 1
            if unserved.total() >= HELD_UNTIL:
                gate.set()  # the healthy shards answer only now
        return await HOSTILE[behaviour](payload)

    async def held(payload: dict[str, Any]) -> web.StreamResponse:
        await gate.wait()
        return await healthy(payload)

    async with fleet([held, held, hostile, hostile]) as (shards, _):
        outcomes, error, run, dispatcher = await dispatch(shards, [f"p{i}" for i in range(64)])
    assert gate.is_set(), "the hostile shards were not asked before the healthy ones served"
    assert max(unserved.values()) >= 2, f"no prompt met both hostile shards before anything was served: {unserved}"
    assert error is None
    kinds = by_kind(outcomes)
    assert kinds["data_failed"] == [], [o.reason for o in kinds["data_failed"]]
    assert len(kinds["completed"]) == 64
    assert {"shard-2", "shard-3"} <= set(dispatcher.ejected)
    assert_accounted(run, outcomes, range(64))


async def test_a_poison_prompt_answered_500_everywhere_ejects_no_shard_and_ends_no_run() -> None:
    prompts = [f"p{i}" for i in range(40)]
    prompts[17] = POISON
    async with fleet([healthy] * 3) as (shards, _):
        outcomes, error, run, dispatcher = await dispatch(shards, prompts)
    assert error is None
    failed = by_kind(outcomes)["data_failed"]
    assert [o.prompt_id for o in failed] == [17]
    assert "poison prompt" in failed[0].reason
    assert "Input validation error" in failed[0].reason, "the server's own words are in the ledger's reason"
    assert len(set(failed[0].shards)) >= 2
    assert run.stats.ejections == 0
    assert dispatcher.ejected == frozenset()
    assert len(by_kind(outcomes)["completed"]) == 39


@pytest.mark.parametrize(
    "busy", [answering(429, error_body("rate limited")), answering(503, error_body("busy"), **{"Retry-After": "1"})]
)
async def test_backpressure_goes_elsewhere_and_ejects_nothing(busy: Handler) -> None:
    async with fleet([healthy, healthy, busy]) as (shards, answered):
        outcomes, error, run, dispatcher = await dispatch(shards, [f"p{i}" for i in range(48)])
    assert answered["shard-2"] >= 1, "the busy shard was never asked"
    assert error is None
    assert len(by_kind(outcomes)["completed"]) == 48
    assert run.stats.ejections == 0
    assert dispatcher.ejected == frozenset()
    assert run.stats.skipped == 0


# --- the same answer, the same first verdict, whichever client read it (and the classify CLI) -------------------------

VERDICTS = {
    401: FailureClass.DATA,  # the shard's or the fleet's, never the prompt's: blame weighs it (tests above)
    403: FailureClass.DATA,
    407: FailureClass.DATA,
    404: FailureClass.DATA,  # "The model `m` does not exist." (and any other 404)
    413: FailureClass.DATA,
    422: FailureClass.DATA,
    400: FailureClass.DATA,
    429: FailureClass.INFRA,
    500: FailureClass.INFRA,
}


def body_for(status: int) -> str:
    return error_body("The model `m` does not exist." if status == 404 else f"refused with {status}")


@pytest.mark.parametrize("status", sorted(VERDICTS))
async def test_every_client_gives_the_same_first_verdict(status: int) -> None:
    async with fleet([answering(status, body_for(status))]) as ((shard,), answered):
        caught: dict[str, BaseException] = {}
        async with GenerationClient() as client:
            try:
                await within(client.complete(shard, "x"), "GenerationClient's answer")
            except Exception as exc:
                caught["GenerationClient"] = exc
        async with httpx.AsyncClient() as http_client:
            response = await within(http_client.post(f"{shard.endpoint}/v1/completions", json={}), "httpx's answer")
            try:
                response.raise_for_status()
            except httpx.HTTPStatusError as exc:
                caught["httpx"] = exc
        oai = openai.AsyncOpenAI(base_url=f"{shard.endpoint}/v1", api_key="k", max_retries=0)
        try:
            await within(oai.completions.create(model="m", prompt="x"), "openai's answer")
        except openai.APIStatusError as exc:
            caught["openai"] = exc
        finally:
            await oai.close()
        import aiohttp

        async with aiohttp.ClientSession() as session:
            try:
                async with session.post(f"{shard.endpoint}/v1/completions", json={}) as raw:
                    raw.raise_for_status()
            except aiohttp.ClientResponseError as exc:
                caught["aiohttp"] = exc
    assert set(caught) == {"GenerationClient", "httpx", "openai", "aiohttp"}, "a client did not raise"
    assert answered["shard-0"] == 4
    caught["EnvironmentClient"] = rollout_failure_for_http_error(status, body_for(status))
    verdicts = {name: (diagnose(exc).failure_class, diagnose(exc).status) for name, exc in caught.items()}
    assert set(verdicts.values()) == {(VERDICTS[status], status)}, verdicts
    printed = CliRunner().invoke(classify, ["--status", str(status)])
    assert f"HTTP {status}: {VERDICTS[status].value}" in printed.output, printed.output
    assert ("never the prompt's" in printed.output) is (status in {401, 403, 404, 407}), printed.output


async def test_a_hung_request_is_not_needed_to_tell_them_apart() -> None:
    """Sanity of the helpers above: a healthy shard completes through the dispatcher."""
    async with fleet([healthy]) as (shards, answered):
        outcomes = (await dispatch(shards, ["a", "b"]))[0]
    assert answered["shard-0"] == 2
    assert sorted(o.result for o in outcomes) == ["done: a", "done: b"]
    await asyncio.sleep(0)
