"""No secret or token reaches a failure reason, the ledger, a log, a metric, a status or an Event.

A credential is planted where real ones turn up: in a shard's error body (a provider's "invalid api key sk-..."),
echoed back from the request's ``Authorization`` header, in a URL's ``user:password@``, in a probe target's reason
phrase and in a redirect's ``Location``. Real servers on 127.0.0.1 serve them; the runtime, the prober, the
environment server and the operator's engine then handle the failures as usual, and every place their text can land
is searched for the credential.
"""

from __future__ import annotations

import json
import logging
import secrets
import traceback
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from fleet_operator.engine import FleetEngine
from fleet_operator.settings import OperatorSettings
from rollout_runtime.dispatch import DataFailed, Dispatcher, DispatchPolicy
from rollout_runtime.environment import EnvironmentClient, EnvironmentServerConfig
from rollout_runtime.failures import RolloutFailure, RolloutRedispatchExhausted, to_picklable_failure
from rollout_runtime.generation import GenerationClient
from rollout_runtime.health import HttpProber, ProbeSettings, ProbeTargetPolicy
from rollout_runtime.redaction import redact_secrets
from rollout_runtime.shards import Shard, StaticShardSource
from rollout_runtime.sim.environments import ArithmeticRequest, ArithmeticResponse, ArithmeticVerifier
from support.dispatch import collect_until_error
from support.httpserver import refused_url, serve

TOKEN = f"sk-planted-{secrets.token_hex(16)}"
"""A provider API key (OpenAI's shape)."""
PASSWORD = secrets.token_hex(12)
"""A plain password: recognisable only by where it sits (URL userinfo, a key=value pair)."""
PROBE = ProbeSettings(period_seconds=1.0, timeout_seconds=0.9, failure_threshold=1, success_threshold=1)


def leaks(texts: Iterable[str]) -> list[str]:
    """The texts that contain a planted credential."""
    return [text[:300] for text in texts if TOKEN in text or PASSWORD in text]


def _token_app() -> web.Application:
    """A misbehaving provider: error bodies, reason phrases, redirects and echoes that carry credentials."""

    async def completions(request: web.Request) -> web.Response:
        mode = request.match_info["mode"]
        if mode == "e400":
            body = {"object": "error", "message": f"Invalid API key provided: {TOKEN}", "code": 400}
            return web.json_response(body, status=400)
        if mode == "e503":
            return web.Response(
                status=503, text=f"upstream rejected Authorization: Bearer {TOKEN} (password={PASSWORD})"
            )
        if mode == "echo":  # a proxy that echoes the request headers into its error
            return web.json_response({"message": f"unauthorized, got {dict(request.headers)}"}, status=401)
        raise web.HTTPNotFound()

    async def health(request: web.Request) -> web.Response:
        mode = request.match_info["mode"]
        if mode == "reason":
            return web.Response(status=500, reason=f"Bearer {TOKEN}")
        if mode == "redirect":
            location = f"http://admin:{PASSWORD}@169.254.169.254/latest/meta-data?token={TOKEN}"
            return web.Response(status=302, headers={"Location": location})
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/{mode}/v1/completions", completions)
    app.router.add_post("/{mode}/v1/chat/completions", completions)
    app.router.add_get("/{mode}/health", health)
    return app


@pytest.fixture
async def provider() -> AsyncIterator[str]:
    async with serve(_token_app()) as url:
        yield url


def test_redaction_removes_the_planted_shapes() -> None:
    for text in (
        f"Authorization: Bearer {TOKEN}",
        f"http://user:{PASSWORD}@10.0.0.1:8000/v1",
        f'{{"api_key": "{PASSWORD}"}}',
        f"password={PASSWORD}&x=1",
        TOKEN,
    ):
        assert not leaks([redact_secrets(text)]), text


async def _dispatch(
    shard: Shard, tmp_path: Path, *, drop_rules: bool = True, **policy: Any
) -> tuple[list[Any], BaseException | None, list[str]]:
    """One prompt through a dispatcher against ``shard``; the outcomes, the run's error, and every sink's text.
    ``drop_rules=False``: an independent request, whose DataFailed is reported instead of ending the run."""
    ledger = tmp_path / "ledger.jsonl"
    registry = CollectorRegistry()
    policy = {"backoff_initial_seconds": 0.0, "backoff_max_seconds": 0.0, **policy}
    async with (
        GenerationClient(timeout_seconds=10) as client,
        Dispatcher(
            StaticShardSource([shard]), DispatchPolicy(failure_ledger_path=ledger, **policy), registry=registry
        ) as dispatcher,
    ):

        async def rollout(target: Shard, prompt: str) -> str:
            return (await client.complete(target, prompt)).text

        outcomes, error = await collect_until_error(dispatcher.run(["What is 1 + 1?"], rollout, drop_rules=drop_rules))
    sinks = [generate_latest(registry).decode()]
    if ledger.exists():
        sinks.append(ledger.read_text())
    for outcome in outcomes:
        sinks.append(repr(outcome))
    if error is not None:
        sinks.append("".join(traceback.format_exception(error)))
    return outcomes, error, sinks


async def test_a_token_in_a_shards_400_body_stays_out_of_the_reason_ledger_logs_and_metrics(
    provider: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    shard = Shard(name="leaky", endpoint=f"{provider}/e400", model="m")
    outcomes, error, sinks = await _dispatch(shard, tmp_path, drop_rules=False)
    assert error is None
    (outcome,) = outcomes
    assert isinstance(outcome, DataFailed)
    assert "Invalid API key provided" in outcome.reason  # the explanation survives, the key does not
    assert not leaks([*sinks, caplog.text])


async def test_a_token_in_a_shards_503_body_stays_out_of_the_run_error_and_its_whole_cause_chain(
    provider: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    shard = Shard(name="leaky", endpoint=f"{provider}/e503", model="m")
    _, error, sinks = await _dispatch(shard, tmp_path, max_infra_attempts=2)
    assert isinstance(error, RolloutRedispatchExhausted)
    assert "upstream rejected" in str(error)
    assert not leaks([*sinks, caplog.text])


async def test_an_echoed_authorization_header_stays_out_of_the_failure(provider: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": PASSWORD}
    async with aiohttp.ClientSession(headers=headers) as session, GenerationClient(session=session) as client:
        with pytest.raises(RolloutFailure) as caught:
            await client.complete(Shard(name="proxy", endpoint=f"{provider}/echo"), "hi")
    assert "unauthorized" in str(caught.value)
    assert not leaks([str(caught.value), str(to_picklable_failure(caught.value))])


async def test_credentials_in_a_shard_url_stay_out_of_failure_messages(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    endpoint = refused_url().replace("http://", f"http://trainer:{PASSWORD}@")
    _, error, sinks = await _dispatch(Shard(name="auth", endpoint=endpoint), tmp_path, max_infra_attempts=1)
    assert isinstance(error, RolloutRedispatchExhausted)
    assert not leaks([*sinks, caplog.text])


async def test_probe_messages_carry_no_credentials_from_urls_reason_phrases_or_redirects(provider: str) -> None:
    async with HttpProber(ProbeTargetPolicy.local()) as prober:
        with_userinfo = await prober.probe(provider.replace("http://", f"http://u:{PASSWORD}@") + "/ok", PROBE)
        reason_phrase = await prober.probe(f"{provider}/reason", PROBE)
        redirect = await prober.probe(f"{provider}/redirect", PROBE)
    assert with_userinfo.reason.value == "forbidden_target"
    assert reason_phrase.reason.value == "status"
    assert redirect.reason.value == "redirect"
    assert not leaks([r.message for r in (with_userinfo, reason_phrase, redirect)])


class RecordingKube:
    """The operator's KubeApi, recording every status and Event it is asked to write."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []
        self.events: list[str] = []

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> Any:
        from fleet_operator.kube import WriteOutcome

        self.statuses.append(status)
        return WriteOutcome.WRITTEN

    async def post_event(self, ref: Any, *, type_: str, reason: str, message: str) -> None:
        self.events.append(f"{reason}: {message}")

    async def list_objects(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        return []


async def test_the_operator_writes_no_credentials_into_statuses_events_logs_or_metrics(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = OperatorSettings(probe_allow_loopback=True, leader_election=False, http_port=0)
    kube = RecordingKube()
    async with HttpProber(settings.probe_policy()) as prober:
        engine = FleetEngine(settings, kube, prober)
        probe = {"periodSeconds": 1, "timeoutSeconds": 0.9, "failureThreshold": 1, "successThreshold": 1}
        for name, endpoint in (
            ("reason", f"{provider}/reason"),
            ("redirect", f"{provider}/redirect"),
        ):
            meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1}
            spec = {"endpoint": endpoint, "probe": probe}
            await engine.upsert_target("GenerationShard", {"metadata": meta, "spec": spec})
        await engine.probe_now()
        await engine.write_pass(0.0)
    written = [json.dumps(status) for status in kube.statuses]
    assert any("lastError" in status for status in written)
    assert kube.events
    metrics = generate_latest(engine.metrics.registry).decode()
    assert not leaks([*written, *kube.events, caplog.text, metrics])


async def test_an_environment_dependencys_token_stays_out_of_the_episode_failure(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = ArithmeticVerifier(EnvironmentServerConfig())
    running = await server.start()
    try:
        request = ArithmeticRequest(problem="1 + 1", generation_url=f"{provider}/e503")
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{running.url}/run", json=request.model_dump(mode="json")) as response:
                raw_reply = await response.text()
            async with session.get(f"{running.url}/metrics") as response:
                metrics = await response.text()
        async with EnvironmentClient(running.url) as client:
            with pytest.raises(RolloutFailure) as caught:
                await client.run_episode(request, ArithmeticResponse)
    finally:
        await running.stop()
    assert "upstream rejected" in raw_reply  # the dependency's explanation is kept
    assert not leaks([raw_reply, metrics, str(caught.value), caplog.text])
