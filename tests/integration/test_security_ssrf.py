"""SSRF holes of issue 15, each against real aiohttp servers on 127.0.0.1 and ``::1`` that record every request.

- ``[::]`` and every other unspecified/any spelling reaches this host's loopback: refused whatever the allowlist;
- redirects are never followed by the generation, environment and probe clients: a 3xx is the target's infra
  failure naming the status and the Location's host, and the redirect's destination is never reached;
- a name allowed by pattern must resolve only into the CIDR allowlist (when it has one), checked at connect time;
- a cluster-service name of another namespace is an invalid spec, never probed.

No traffic leaves loopback: every name that is resolved is numeric or resolved by a fake inner resolver.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import ResolveResult

from fleet_operator.engine import FleetEngine
from fleet_operator.settings import OperatorSettings
from rollout_runtime.environment import EnvironmentClient, EnvironmentServerConfig
from rollout_runtime.failures import GenerationUnavailable, GymTransportError, RolloutInfraFailure
from rollout_runtime.generation import GenerationClient
from rollout_runtime.health import HttpProber, ProbeReason, ProbeSettings, ProbeTargetPolicy
from rollout_runtime.health.probe import _ForbiddenAddress, _PolicyResolver
from rollout_runtime.shards import Shard
from rollout_runtime.sim.environments import MAX_REPLY_BYTES, ArithmeticRequest, ArithmeticVerifier
from support.httpserver import serve
from support.recording_kube import RecordingKube

PROBE = ProbeSettings(period_seconds=1.0, timeout_seconds=0.9, failure_threshold=1, success_threshold=1)
EVERYTHING_BUT_LOOPBACK = ProbeTargetPolicy(allowed_hosts=("*", "0.0.0.0/0", "::/0"), allow_loopback=False)
HOSTS = ["127.0.0.1", "::1"]
API_KEY = "sk-trainer-key-0123456789abcdef"


def _port(url: str) -> str:
    return url.rsplit(":", 1)[1]


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[dict[str, str], list[str]]]:
    """One recording server on each of 127.0.0.1 and ::1 (the same hit list): {host: base URL}, hits."""
    hits: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        hits.append(f"{request.method} {request.path} {request.headers.get('Authorization', '')}")
        return web.json_response({"data": [{"id": "m"}], "choices": [{"text": "2", "message": {"content": "2"}}]})

    app_v4, app_v6 = web.Application(), web.Application()
    for app in (app_v4, app_v6):
        app.router.add_route("*", "/{tail:.*}", anything)
    async with serve(app_v4, "127.0.0.1") as v4, serve(app_v6, "::1") as v6:
        yield {"127.0.0.1": v4, "::1": v6}, hits


# -- unspecified / any addresses --------------------------------------------------------------------------------

UNSPECIFIED_SPELLINGS = [
    "[::]",
    "[0:0:0:0:0:0:0:0]",
    "[::ffff:0.0.0.0]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::127.0.0.1]",  # deprecated IPv4-compatible
    "[2002:7f00:1::]",  # 6to4 carrying 127.0.0.1
    "0.0.0.0",
    "0",  # a "name" the resolver turns into 0.0.0.0
    "0x0",
]


@pytest.mark.parametrize("host", UNSPECIFIED_SPELLINGS)
@pytest.mark.parametrize("family", HOSTS)
async def test_unspecified_and_loopback_carrying_addresses_are_refused_even_with_everything_allowlisted(
    recorder: tuple[dict[str, str], list[str]], host: str, family: str
) -> None:
    urls, hits = recorder
    async with HttpProber(EVERYTHING_BUT_LOOPBACK) as prober:
        result = await prober.probe(f"http://{host}:{_port(urls[family])}", PROBE, expected_model="m")
    assert not result.ok
    assert result.reason in (ProbeReason.FORBIDDEN_TARGET, ProbeReason.ERROR), result
    assert hits == []


@pytest.mark.parametrize("address", ["::", "0.0.0.0", "::ffff:0.0.0.0", "::ffff:127.0.0.1"])
async def test_a_name_resolving_to_an_unspecified_address_is_refused_at_connect_time(address: str) -> None:
    resolver = _PolicyResolver(EVERYTHING_BUT_LOOPBACK)
    resolver._inner = _FixedResolver(address)  # type: ignore[assignment]
    try:
        with pytest.raises(_ForbiddenAddress):
            await resolver.resolve("shard.example", 80, socket.AF_UNSPEC)
    finally:
        await resolver.close()


def test_unspecified_addresses_are_refused_by_the_policy_itself() -> None:
    policy = ProbeTargetPolicy(allowed_hosts=("::/0", "0.0.0.0/0"), allow_loopback=True)
    for address in ("::", "0.0.0.0", "0.1.2.3", "::ffff:0.0.0.0", "::0.0.0.0"):
        assert not policy.check_address(address).allowed, address
    assert policy.check_address("::1").allowed  # loopback (allowed here) is not the unspecified address
    assert not EVERYTHING_BUT_LOOPBACK.check_address("::ffff:127.0.0.1").allowed
    assert not EVERYTHING_BUT_LOOPBACK.check_address("::127.0.0.1").allowed


# -- resolved addresses against the CIDR allowlist -------------------------------------------------------------


class _FixedResolver:
    """Stands in for aiohttp's resolver: every name resolves to ``addresses`` (no DNS traffic)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=0,
            )
            for address in self.addresses
        ]

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("addresses", "allowed"),
    [
        (("10.1.2.3",), True),
        (("10.1.2.3", "192.168.0.9"), False),  # one address outside the blocks refuses the name
        (("192.168.0.9",), False),
        (("fd12::1",), False),
    ],
)
async def test_a_name_allowed_by_pattern_must_resolve_into_the_cidr_allowlist(
    addresses: tuple[str, ...], allowed: bool
) -> None:
    policy = ProbeTargetPolicy(allowed_hosts=("*.gpu.internal", "10.0.0.0/8"))
    assert policy.check("http://shard-0.gpu.internal:8000/health").allowed
    resolver = _PolicyResolver(policy)
    resolver._inner = _FixedResolver(*addresses)  # type: ignore[assignment]
    try:
        if allowed:
            assert [r["host"] for r in await resolver.resolve("shard-0.gpu.internal", 8000)] == list(addresses)
        else:
            with pytest.raises(_ForbiddenAddress, match="not in allowed_hosts"):
                await resolver.resolve("shard-0.gpu.internal", 8000)
    finally:
        await resolver.close()


def test_an_exactly_listed_name_is_constrained_by_the_forbidden_ranges_only() -> None:
    """What LocalShardSource builds from its own endpoints: an IP and a name side by side, the name anywhere."""
    policy = ProbeTargetPolicy.for_endpoints(["http://127.0.0.1:9000", "http://gpu-3.lab:8000"])
    assert policy.check_resolved("gpu-3.lab", "10.4.4.4").allowed
    assert not policy.check_resolved("gpu-3.lab", "169.254.169.254").allowed
    assert not policy.check_resolved("gpu-3.lab", "::").allowed


def test_without_cidr_blocks_a_pattern_allowed_name_is_constrained_by_the_forbidden_ranges_only() -> None:
    policy = ProbeTargetPolicy(allowed_hosts=("*.gpu.internal",))
    assert policy.check_resolved("a.gpu.internal", "10.9.9.9").allowed
    assert not policy.check_resolved("a.gpu.internal", "169.254.169.254").allowed
    assert not policy.check_resolved("a.gpu.internal", "::").allowed
    # cluster services resolve to cluster IPs, whichever blocks are listed
    assert ProbeTargetPolicy(allowed_hosts=("10.0.0.0/8",)).check_resolved("s.team.svc", "172.20.0.4").allowed


# -- cluster services stay in their namespace ------------------------------------------------------------------


def test_a_cluster_service_of_another_namespace_is_refused_when_the_namespace_is_known() -> None:
    policy = ProbeTargetPolicy()
    assert policy.check("http://s.team-a.svc:8000", namespace="team-a").allowed
    assert policy.check("http://s.team-a.svc.cluster.local:8000", namespace="team-a").allowed
    assert not policy.check("http://s.team-b.svc:8000", namespace="team-a").allowed
    assert not policy.check_endpoint("http://s.team-b.svc.cluster.local:8000", "team-a").allowed
    # an operator that lists another namespace's Service explicitly allows it
    listed = ProbeTargetPolicy(allowed_hosts=("*.shared.svc",))
    assert listed.check_endpoint("http://s.shared.svc:8000", "team-a").allowed


async def test_the_operator_refuses_foreign_namespace_services_unspecified_and_keyed_endpoints(
    recorder: tuple[dict[str, str], list[str]],
) -> None:
    """With the allowlist ``::/0`` and loopback off: ``[::]`` is never probed nor published; a Service of another
    namespace and an endpoint with a key in its path are invalid specs whose key never reaches the status."""
    urls, hits = recorder
    settings = OperatorSettings(leader_election=False, probe_allowed_hosts=["::/0", "0.0.0.0/0"])
    kube = RecordingKube()
    probe = {"periodSeconds": 1, "timeoutSeconds": 0.9, "failureThreshold": 1, "successThreshold": 1}
    endpoints = {
        "any6": f"http://[::]:{_port(urls['::1'])}",
        "any4": f"http://0.0.0.0:{_port(urls['127.0.0.1'])}",
        "foreign": "http://shard.team-b.svc.cluster.local:8000",
        "keyed": f"http://[::]:{_port(urls['::1'])}/v1/{API_KEY}",
    }
    async with HttpProber(settings.probe_policy()) as prober:
        engine = FleetEngine(settings, kube, prober)
        for name, endpoint in endpoints.items():
            meta = {"name": name, "namespace": "team-a", "uid": name, "generation": 1, "labels": {"fleet": "f"}}
            await engine.upsert_target(
                "GenerationShard", {"metadata": meta, "spec": {"endpoint": endpoint, "probe": probe}}
            )
        fleet_meta = {"name": "f", "namespace": "team-a", "uid": "fleet", "generation": 1}
        await engine.upsert_fleet({"metadata": fleet_meta, "spec": {"shardSelector": {"matchLabels": {"fleet": "f"}}}})
        await engine.prime()
        await engine.probe_now()
        await engine.write_pass(asyncio.get_running_loop().time() + 60.0)
    for name in ("any6", "any4"):
        assert kube.statuses[name]["phase"] == "Unhealthy", kube.statuses[name]
        assert "forbidden_target" in kube.statuses[name]["lastError"]
    assert kube.statuses["foreign"]["phase"] == "Pending"
    assert "namespace" in kube.statuses["foreign"]["lastError"]
    assert kube.statuses["keyed"]["phase"] == "Pending"
    assert "credential" in kube.statuses["keyed"]["lastError"]
    assert API_KEY not in str(kube.statuses)
    assert kube.statuses["f"]["shards"] == []
    assert hits == []


# -- redirects are never followed ------------------------------------------------------------------------------


def _redirecting_app(location: str) -> web.Application:
    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": location + request.path_qs})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    return app


@pytest.mark.parametrize("family", HOSTS)
async def test_the_generation_client_never_follows_a_redirect(
    recorder: tuple[dict[str, str], list[str]], family: str
) -> None:
    urls, hits = recorder
    elsewhere = urls["::1" if family == "127.0.0.1" else "127.0.0.1"]
    async with serve(_redirecting_app(elsewhere + f"/{API_KEY}"), family) as shard_url:
        shard = Shard(name="s0", endpoint=shard_url, model="m")
        async with (
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as session,  # the trainer's key
            GenerationClient(timeout_seconds=5, session=session) as client,
        ):
            with pytest.raises(GenerationUnavailable) as caught:
                await client.complete(shard, "What is 1 + 1?")
    assert caught.value.status == 307
    message = str(caught.value)
    assert "307" in message
    assert "never followed" in message
    assert elsewhere.split("//")[1].rsplit(":", 1)[0].strip("[]") in message  # the Location's host is named
    assert API_KEY not in message
    assert hits == []  # neither the prompt nor the key went there


@pytest.mark.parametrize("family", HOSTS)
async def test_the_environment_client_never_follows_a_redirect(
    recorder: tuple[dict[str, str], list[str]], family: str
) -> None:
    urls, hits = recorder
    async with serve(_redirecting_app(urls["127.0.0.1"]), family) as env_url, EnvironmentClient(env_url) as client:
        with pytest.raises(RolloutInfraFailure) as caught:
            await client.run_episode({"episode_id": "e1", "problem": "1 + 1"})
        with pytest.raises(RolloutInfraFailure):
            await client.health()
    assert isinstance(caught.value, GymTransportError)
    assert caught.value.status == 307
    assert "redirect" in str(caught.value)
    assert hits == []


@pytest.mark.parametrize("family", HOSTS)
async def test_the_prober_never_follows_a_redirect(recorder: tuple[dict[str, str], list[str]], family: str) -> None:
    urls, hits = recorder
    async with (
        serve(_redirecting_app(urls["::1"] + f"/?key={API_KEY}"), family) as shard_url,
        HttpProber(ProbeTargetPolicy.local()) as prober,
    ):
        result = await prober.probe(shard_url, PROBE, expected_model="m")
    assert result.reason is ProbeReason.REDIRECT
    assert "307" in (result.message or "")
    assert API_KEY not in (result.message or "")
    assert hits == []


# -- the sim verifier's echo is bounded and redacted -----------------------------------------------------------


async def test_the_sim_verifier_reads_a_bounded_reply_and_echoes_it_redacted() -> None:
    huge = b"x" * (MAX_REPLY_BYTES * 16)
    keyed = f'{{"error": "Invalid API key: {API_KEY}", "pad": "{"y" * 5000}"}}'.encode()

    async def completions(request: web.Request) -> web.Response:
        body = huge if request.match_info["mode"] == "huge" else keyed
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{mode}/v1/chat/completions", completions)
    server = ArithmeticVerifier(EnvironmentServerConfig())
    running = await server.start()
    try:
        async with serve(app) as generation, aiohttp.ClientSession() as session:
            replies = {}
            for mode in ("huge", "keyed"):
                request = ArithmeticRequest(episode_id=mode, problem="1 + 1", generation_url=f"{generation}/{mode}")
                async with session.post(f"{running.url}/run", json=request.model_dump(mode="json")) as response:
                    replies[mode] = await response.text()  # the whole reply, evidence included
    finally:
        await running.stop()
    assert "larger than" in replies["huge"]
    assert len(replies["huge"]) < 4096
    assert "xxxxxxxxxx" * 10 not in replies["huge"]
    assert "Invalid API key" in replies["keyed"]  # the evidence is there, without the key
    assert API_KEY not in replies["keyed"]
    assert len(replies["keyed"]) < 4096
