"""The router's pure parts: ``--shard`` parsing, the stream error event, its config."""

from __future__ import annotations

import json
import logging

import click
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from rollout_runtime.cli.router import shards_from_urls
from rollout_runtime.router import RouterConfig, stream_error_event
from rollout_runtime.router.http import AccessLogger, access_log


def test_shards_are_named_by_host_and_port_unless_named() -> None:
    shards = shards_from_urls(("http://10.0.0.7:8000", "b=http://10.0.0.8:8000/"))
    assert [(s.name, s.endpoint) for s in shards] == [("10.0.0.7:8000", "http://10.0.0.7:8000"),
                                                       ("b", "http://10.0.0.8:8000")]  # fmt: skip


@pytest.mark.parametrize("value", ["10.0.0.7:8000", "ftp://host", "a=notaurl"])
def test_a_shard_that_is_not_an_http_url_is_a_usage_error(value: str) -> None:
    with pytest.raises(click.BadParameter, match="is not an http"):
        shards_from_urls((value,))


def test_two_shards_with_one_name_are_refused() -> None:
    with pytest.raises(click.BadParameter, match="unique"):
        shards_from_urls(("a=http://h:1", "a=http://h:2"))


def test_the_stream_error_event_is_an_sse_error_event_openai_clients_raise_on() -> None:
    event = stream_error_event("shard s1 was silent", "s1")
    assert event.startswith(b"event: error\ndata: ")
    assert event.endswith(b"\n\n")
    payload = json.loads(event.split(b"data: ", 1)[1])
    assert payload["error"] == {"message": "shard s1 was silent", "type": "stream_interrupted", "code": 502,
                                "shard": "s1"}  # fmt: skip


def test_the_router_relays_a_shards_4xx_at_once_and_bounds_a_requests_attempts() -> None:
    """An exhausted request is that request's answer: the router's runs are independent requests (drop_rules=False,
    tests/unit/test_dispatch_drops.py), so no drop allowance ends the router."""
    policy = RouterConfig(max_attempts=4).dispatch_policy()
    assert policy.max_data_attempts == 1
    assert policy.max_infra_attempts == 4


def test_the_router_may_eject_every_failing_shard_by_default() -> None:
    """Its clients send each request once: shards held back from ejection by the dispatcher's 50 % cap burn the
    request's attempts (bench/failover.py lost prompts to it); the dispatcher's panic mode still routes to all."""
    assert RouterConfig().dispatch_policy().max_ejection_percent == 100
    assert RouterConfig(max_ejection_percent=50).dispatch_policy().max_ejection_percent == 50


def test_the_access_log_line_has_the_shard_and_never_a_body_or_header(caplog: pytest.LogCaptureFixture) -> None:
    request = make_mocked_request(
        "POST", "/v1/completions?api_key=k", headers={"Authorization": "Bearer sk-secret"}, payload=b'{"prompt": "p"}'
    )
    response = web.Response(body=b'{"choices": []}', headers={"X-Rollout-Shard": "shard-a"})
    with caplog.at_level(logging.INFO, logger="rollout_runtime.router.access"):
        AccessLogger(access_log, "").log(request, response, 0.0123)

    assert caplog.messages == [f"{request.remote} POST /v1/completions 200 12.3ms shard=shard-a"]
