"""The probe allowlist holds end to end: through the real prober and through the operator's reconciliation.

A GenerationShard's URL is chosen by whoever may create one, and the operator fetches it from inside the cluster,
so every classic server-side-request-forgery trick is tried here: metadata addresses in every notation, other
schemes, credentials and fragments that move the host, look-alike cluster names, and numeric spellings that only
resolve to a refused address at connect time. A real server on 127.0.0.1 counts every request it gets: a refused
target must never be reached.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

from fleet_operator.engine import FleetEngine
from fleet_operator.settings import OperatorSettings
from rollout_runtime.health import HttpProber, ProbeReason, ProbeSettings, ProbeTargetPolicy
from rollout_runtime.health.probe import _ForbiddenAddress, _PolicyResolver
from support.chaos import write_tally
from support.httpserver import serve
from support.recording_kube import RecordingKube

PROBE = ProbeSettings(period_seconds=1.0, timeout_seconds=0.9, failure_threshold=1, success_threshold=1)
OPERATOR_DEFAULT = OperatorSettings(leader_election=False).probe_policy()
EVERYTHING_ALLOWLISTED = OperatorSettings(
    leader_election=False, probe_allowed_hosts=["*", "0.0.0.0/0", "::/0", "169.254.169.254"]
).probe_policy()

SSRF_TARGETS = [
    # cloud metadata, every spelling the URL parser sees as an address
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://169.254.170.2/v2/credentials",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://[fe80::1]/",
    "http://100.100.100.200/latest/meta-data/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://metadata/computeMetadata/v1/",
    "http://instance-data/latest/",
    "http://0.0.0.0:8000/",
    "http://224.0.0.1/",
    "http://255.255.255.255/",
    # schemes other than http(s)
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_FLUSHALL",
    "ftp://10.0.0.7/x",
    "ws://shard.team.svc:8000/",
    "dict://127.0.0.1:11211/",
    "javascript:alert(1)",
    "data:text/plain,hello",
    # the host moved by userinfo or a fragment
    "http://shard.team.svc.cluster.local@169.254.169.254/",
    "http://user:pass@shard.team.svc/",
    "http://169.254.169.254#@shard.team.svc/",
    # look-alikes of an in-cluster Service name
    "http://shard.team.svc.cluster.local.evil.example/",
    "http://evil.example/shard.team.svc.cluster.local",
    "http://shard.team.svc.cluster.local:8000@evil.example/",
    "http://\u0455hard.team.svc/",  # Cyrillic dze
    "http://shard..svc/",
    # loopback and arbitrary hosts (not allowlisted by default)
    "http://127.0.0.1:8000/",
    "http://localhost:8000/",
    "http://[::1]:8000/",
    "http://10.0.0.7:8000/",
    "http://example.com/",
    # malformed
    "http://[::1/",
    "http://shard.team.svc:99999/",
    "http:///health",
    "http://" + "a" * 3000 + ".team.svc/",
]
TALLY: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def targets_report() -> Iterator[None]:
    yield
    write_tally("security-probe-targets", TALLY)


ALWAYS_REFUSED = [url for url in SSRF_TARGETS if "169.254" in url or "fd00:ec2" in url or "100.100.100.200" in url]


@pytest.fixture
async def counting_server() -> AsyncIterator[tuple[str, list[str]]]:
    hits: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text='{"data": [{"id": "m"}]}')

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    async with serve(app) as url:
        yield url, hits


@pytest.mark.parametrize("url", SSRF_TARGETS)
async def test_the_operators_default_policy_refuses_ssrf_targets_before_any_connection(url: str) -> None:
    TALLY["test_the_operators_default_policy_refuses_ssrf_targets_before_any_connection"] += 1
    async with HttpProber(OPERATOR_DEFAULT) as prober:
        result = await prober.probe(url, PROBE, expected_model="m")
    assert not result.ok
    assert result.reason is ProbeReason.FORBIDDEN_TARGET, result


@pytest.mark.parametrize("url", ALWAYS_REFUSED)
async def test_metadata_targets_stay_refused_even_when_an_operator_allowlists_everything(url: str) -> None:
    TALLY["test_metadata_targets_stay_refused_even_when_an_operator_allowlists_everything"] += 1
    async with HttpProber(EVERYTHING_ALLOWLISTED) as prober:
        result = await prober.probe(url, PROBE)
    assert result.reason is ProbeReason.FORBIDDEN_TARGET, result


@pytest.mark.parametrize(
    "host",
    ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0x7f.1"],
)
async def test_numeric_spellings_of_a_refused_address_are_caught_at_connect_time(
    counting_server: tuple[str, list[str]], host: str
) -> None:
    """With names allowlisted but loopback refused, decimal/hex/octal/short spellings of 127.0.0.1 pass the URL
    check as names; the URL parser refuses the non-canonical ones and the resolver refuses the address the rest
    resolve to: either way the probe fails and the server gets no request."""
    TALLY["test_numeric_spellings_of_a_refused_address_are_caught_at_connect_time"] += 1
    url, hits = counting_server
    port = url.rsplit(":", 1)[1]
    policy = ProbeTargetPolicy(allowed_hosts=("*",), allow_loopback=False)
    async with HttpProber(policy) as prober:
        result = await prober.probe(f"http://{host}:{port}", PROBE)
    assert not result.ok
    assert result.reason in (ProbeReason.FORBIDDEN_TARGET, ProbeReason.ERROR), result
    assert hits == []


@pytest.mark.parametrize("host", ["2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "169.254.43518"])
async def test_numeric_spellings_of_the_metadata_address_are_refused_by_the_resolver(host: str) -> None:
    """The same spellings of 169.254.169.254: resolved (numerically, no network) and refused, never connected."""
    TALLY["test_numeric_spellings_of_the_metadata_address_are_refused_by_the_resolver"] += 1
    resolver = _PolicyResolver(EVERYTHING_ALLOWLISTED)
    try:
        with pytest.raises(_ForbiddenAddress, match=r"169\.254\.169\.254"):
            await resolver.resolve(host, 80, socket.AF_INET)
    finally:
        await resolver.close()


async def test_a_redirect_to_the_metadata_address_is_not_followed(counting_server: tuple[str, list[str]]) -> None:
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")

    app = web.Application()
    app.router.add_get("/health", redirect)
    async with serve(app) as url, HttpProber(ProbeTargetPolicy.local()) as prober:
        result = await prober.probe(url, PROBE)
    assert result.reason is ProbeReason.REDIRECT


async def test_the_operator_never_probes_a_forbidden_shard_and_keeps_it_out_of_the_healthy_set(
    counting_server: tuple[str, list[str]],
) -> None:
    """Shards whose endpoints the allowlist refuses go Unhealthy with a forbidden_target error, are never
    contacted, and never enter a fleet's healthy set; an allowlisted one next to them serves."""
    url, hits = counting_server
    settings = OperatorSettings(leader_election=False, probe_allowed_hosts=["127.0.0.1/32"], probe_allow_loopback=True)
    kube = RecordingKube()
    probe = {"periodSeconds": 1, "timeoutSeconds": 0.9, "failureThreshold": 1, "successThreshold": 1}
    endpoints = {
        "metadata": "http://169.254.169.254",
        "mapped": "http://[::ffff:169.254.169.254]:80",
        "foreign": "http://10.0.0.7:8000",
        "userinfo": url.replace("http://", "http://a:b@"),
        "good": url,
    }
    async with HttpProber(settings.probe_policy()) as prober:
        engine = FleetEngine(settings, kube, prober)
        for name, endpoint in endpoints.items():
            meta = {"name": name, "namespace": "ns", "uid": name, "generation": 1, "labels": {"fleet": "f"}}
            await engine.upsert_target(
                "GenerationShard", {"metadata": meta, "spec": {"endpoint": endpoint, "probe": probe}}
            )
        fleet_meta = {"name": "f", "namespace": "ns", "uid": "fleet", "generation": 1}
        await engine.upsert_fleet({"metadata": fleet_meta, "spec": {"shardSelector": {"matchLabels": {"fleet": "f"}}}})
        await engine.prime()
        await engine.probe_now()
        await engine.write_pass(asyncio.get_running_loop().time() + 60.0)
    for name in ("metadata", "mapped", "foreign"):
        status = kube.statuses[name]
        assert status["phase"] == "Unhealthy", status
        assert "forbidden_target" in status["lastError"], status
    # Credentials in an endpoint make the spec invalid (the CRD refuses it too): never probed, never echoed.
    userinfo = kube.statuses["userinfo"]
    assert userinfo["phase"] == "Pending", userinfo
    assert "must not carry credentials" in userinfo["lastError"], userinfo
    assert "a:b@" not in str(userinfo)
    assert kube.statuses["good"]["phase"] == "Healthy"
    assert [entry["name"] for entry in kube.statuses["f"]["shards"]] == ["good"]
    assert set(hits) == {"/health"}  # only the allowlisted shard was contacted
