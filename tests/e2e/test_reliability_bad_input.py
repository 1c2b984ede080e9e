"""Bad input on the real kube-apiserver: invalid custom resources are rejected with messages that say what is wrong,
and resources the schema admits but that are odd never crash the operator.

The invalid cases here extend the operator's own set (tests/e2e/test_operator_crd_validation.py) without repeating
it: URL shapes, bounds on every numeric field, types, enums, unknown fields, names, selectors and policy rules. Each
case has its own object name, so a case that were wrongly admitted could not turn the next one into an update. The
tally is written to ``reports/chaos/bad-input.json`` for docs/reliability.md.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_runtime.sim import SimFleet
from support.chaos import report_dir
from support.controlplane import ControlPlane
from support.httpserver import refused_url
from support.operator import OperatorProcess, api_client, status_of, wait_for_object

pytestmark = pytest.mark.e2e

API = "rolloutfleet.dev/v1alpha1"
OK = {"endpoint": "http://10.0.0.7:8000"}
SELECT = {"shardSelector": {"matchLabels": {"fleet": "a"}}}


def _obj(kind: str, name: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": API, "kind": kind, "metadata": {"name": name}}
    if spec is not None:
        obj["spec"] = spec
    return obj


def shard(name: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    return _obj("GenerationShard", name, spec)


def env(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _obj("EnvironmentServer", name, spec)


def fleet(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _obj("RolloutFleet", name, spec)


def policy(**fields: Any) -> dict[str, Any]:
    return {**SELECT, "policy": fields}


INVALID: list[tuple[str, dict[str, Any], str]] = [
    # GenerationShard: where it is
    (
        "endpoint with credentials",
        shard("creds", {"endpoint": "http://user:hunter2@10.0.0.7:8000"}),
        "endpoint must not carry credentials",
    ),
    (
        "endpoint with a query",
        shard("q", {"endpoint": "http://10.0.0.7:8000/v1?x=1"}),
        "spec.endpoint in body should match",
    ),
    (
        "endpoint with a space",
        shard("ws", {"endpoint": "http://10.0.0.7 :8000"}),
        "endpoint must be an absolute http(s) URL with a host",
    ),
    (
        "endpoint without a host",
        shard("nohost", {"endpoint": "http:///health"}),
        "endpoint must be an absolute http(s) URL with a host",
    ),
    (
        "endpoint over 2048 bytes",
        shard("long", {"endpoint": "http://" + "a" * 2100 + ".example"}),
        "spec.endpoint: Too long: may not be more than 2048",
    ),
    (
        "service port zero",
        shard("port0", {"serviceRef": {"name": "vllm", "port": 0}}),
        "spec.serviceRef.port in body should be greater than or equal to 1",
    ),
    (
        "service scheme ftp",
        shard("scheme", {"serviceRef": {"name": "vllm", "scheme": "ftp"}}),
        'spec.serviceRef.scheme: Unsupported value: "ftp"',
    ),
    (
        "service name over 63",
        shard("svclong", {"serviceRef": {"name": "a" * 70}}),
        "spec.serviceRef.name: Too long: may not be more than 63",
    ),
    ("no spec at all", shard("nospec", None), "spec: Required value"),
    # GenerationShard: what it serves and how it is weighed
    (
        "maxModelLen zero",
        shard("mml0", {**OK, "maxModelLen": 0}),
        "spec.maxModelLen in body should be greater than or equal to 1",
    ),
    (
        "maxModelLen absurd",
        shard("mmlbig", {**OK, "maxModelLen": 200_000_000}),
        "spec.maxModelLen in body should be less than or equal to 100000000",
    ),
    ("negative weight", shard("wneg", {**OK, "weight": -1}), "spec.weight in body should be greater than 0"),
    ("weight as a word", shard("wstr", {**OK, "weight": "heavy"}), "spec.weight in body must be of type number"),
    (
        "model name over 512",
        shard("model", {**OK, "model": "m" * 600}),
        "spec.model: Too long: may not be more than 512",
    ),
    ("drain as a word", shard("drain", {**OK, "drain": "yes"}), "spec.drain in body must be of type boolean"),
    ("unknown spec field", shard("unk", {**OK, "replicas": 3}), 'strict decoding error: unknown field "spec.replicas"'),
    ("name not a DNS subdomain", shard("Shard_0", OK), "a lowercase RFC 1123 subdomain must consist of"),
    # GenerationShard: probing
    (
        "probe period below 50 ms",
        shard("period", {**OK, "probe": {"periodSeconds": 0.01, "timeoutSeconds": 0.005}}),
        "spec.probe.periodSeconds in body should be greater than or equal to 0.05",
    ),
    (
        "probe failure threshold 1001",
        shard("ft", {**OK, "probe": {"failureThreshold": 1001}}),
        "spec.probe.failureThreshold in body should be less than or equal to 1000",
    ),
    (
        "probe path with a query",
        shard("pathq", {**OK, "probe": {"path": "/health?x=1"}}),
        "spec.probe.path in body should match",
    ),
    (
        "negative probe period",
        shard("pneg", {**OK, "probe": {"periodSeconds": -1}}),
        "spec.probe.periodSeconds in body should be greater than or equal to",  # to 0: an integer meets int64(0.05)
    ),
    # EnvironmentServer
    ("protocol not a DNS label", env("proto", {**OK, "protocol": "Episode_V1"}), "spec.protocol in body should match"),
    (
        "episode timeout zero",
        env("ept0", {**OK, "episodeTimeoutSeconds": 0}),
        "spec.episodeTimeoutSeconds in body should be greater than 0",
    ),
    (
        "episode concurrency absurd",
        env("mce", {**OK, "maxConcurrentEpisodes": 2_000_000}),
        "spec.maxConcurrentEpisodes in body should be less than or equal to 1000000",
    ),
    ("environment server nowhere", env("envneither", {"protocol": "episode-v1"}), "set exactly one of spec.serviceRef"),
    # RolloutFleet: selection
    (
        "negative minReadyShards",
        fleet("minready", {**SELECT, "minReadyShards": -1}),
        "spec.minReadyShards in body should be greater than or equal to 0",
    ),
    (
        "selector operator Contains",
        fleet("op", {"shardSelector": {"matchExpressions": [{"key": "z", "operator": "Contains", "values": ["a"]}]}}),
        'Unsupported value: "Contains"',
    ),
    (
        "Exists with values",
        fleet("exists", {"shardSelector": {"matchExpressions": [{"key": "z", "operator": "Exists", "values": ["a"]}]}}),
        "Exists and DoesNotExist take no values",
    ),
    (
        "label value over 63",
        fleet("mlv", {"shardSelector": {"matchLabels": {"fleet": "x" * 70}}}),
        "spec.shardSelector.matchLabels.fleet: Too long",
    ),
    (
        "selector as a string",
        fleet("selstr", {"shardSelector": "fleet=a"}),
        "spec.shardSelector in body must be of type object",
    ),
    (
        "environment selector NotIn without values",
        fleet(
            "envsel", {**SELECT, "environmentServerSelector": {"matchExpressions": [{"key": "k", "operator": "NotIn"}]}}
        ),
        "operators In and NotIn need at least one value",
    ),
    # RolloutFleet: the runtime's policy
    (
        "zero infra attempts",
        fleet("mia0", policy(maxInfraAttempts=0)),
        "spec.policy.maxInfraAttempts in body should be greater than or equal to 1",
    ),
    (
        "101 data attempts",
        fleet("mda", policy(maxDataAttempts=101)),
        "spec.policy.maxDataAttempts in body should be less than or equal to 100",
    ),
    (
        "jitter above 1",
        fleet("jitter", policy(backoffJitter=1.5)),
        "spec.policy.backoffJitter in body should be less than or equal to 1",
    ),
    (
        "backoff multiplier below 1",
        fleet("mult", policy(backoffMultiplier=0.5)),
        "spec.policy.backoffMultiplier in body should be greater than or equal to 1",
    ),
    (
        "attempt timeout zero",
        fleet("att0", policy(attemptTimeoutSeconds=0)),
        "spec.policy.attemptTimeoutSeconds in body should be greater than 0",
    ),
    (
        "stall check beyond the deadline",
        fleet("stallcheck", policy(stallCheckSeconds=700, stallDeadlineSeconds=600)),
        "policy.stallCheckSeconds must not exceed policy.stallDeadlineSeconds",
    ),
    (
        "ejection max below base",
        fleet("eject", policy(ejectionBaseSeconds=60, ejectionMaxSeconds=10)),
        "policy.ejectionMaxSeconds must be at least policy.ejectionBaseSeconds",
    ),
    (
        "ejection percent 150",
        fleet("ejpct", policy(maxEjectionPercent=150)),
        "spec.policy.maxEjectionPercent in body should be less than or equal to 100",
    ),
]

TALLY: dict[str, Any] = {"tried": 0, "rejected": 0, "cases": {}}


@pytest.fixture(scope="module", autouse=True)
def bad_input_report() -> Iterator[None]:
    yield
    if TALLY["tried"]:
        directory = report_dir()
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "bad-input.json").write_text(json.dumps({"scenario": "bad-input", **TALLY}, indent=2) + "\n")


def apply(plane: ControlPlane, namespace: str, *objects: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    return plane.kubectl("apply", "-n", namespace, "-f", "-", input=document, check=False)


def create_raw(plane: ControlPlane, namespace: str, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """POST the object straight to the API server (strict field validation, no client-side checks): what comes
    back is the API server's own message."""
    plural = {"GenerationShard": "generationshards", "EnvironmentServer": "environmentservers"}.get(
        obj["kind"], "rolloutfleets"
    )
    path = f"/apis/{API}/namespaces/{namespace}/{plural}?fieldValidation=Strict"
    return plane.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(obj), check=False)


@pytest.mark.parametrize(("case", "obj", "message"), INVALID, ids=[case for case, _, _ in INVALID])
def test_an_invalid_resource_is_rejected_by_the_api_server_saying_what_is_wrong(
    fleet_crds: ControlPlane, fleet_namespace: str, case: str, obj: dict[str, Any], message: str
) -> None:
    result = create_raw(fleet_crds, fleet_namespace, obj)
    TALLY["tried"] += 1
    TALLY["rejected"] += result.returncode != 0
    lines = result.stderr.strip().splitlines() or ["ACCEPTED"]
    TALLY["cases"][case] = next((line for line in lines if message in line), lines[-1])[:300]
    assert result.returncode != 0, f"{case}: accepted"
    assert message in result.stderr, result.stderr
    listed = fleet_crds.kubectl("get", obj["kind"].lower(), "-n", fleet_namespace, "-o", "name").stdout
    assert obj["metadata"]["name"].lower() not in listed


def test_the_cases_are_many_distinct_and_cover_every_kind() -> None:
    assert len(INVALID) >= 20
    assert len({name for name, _, _ in INVALID}) == len(INVALID)
    assert len({(o["kind"], o["metadata"]["name"]) for _, o, _ in INVALID}) == len(INVALID)
    assert {o["kind"] for _, o, _ in INVALID} == {"GenerationShard", "EnvironmentServer", "RolloutFleet"}


PROBE = {"periodSeconds": 0.5, "timeoutSeconds": 0.4, "failureThreshold": 2, "successThreshold": 2}


def odd_objects(good_endpoint: str) -> list[dict[str, Any]]:
    """Resources the schema admits that no sane user writes."""
    labels = {"fleet": "odd"}
    refused = refused_url()
    long_name = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # 253 characters, the longest legal name
    shards = [
        ("unreachable", {"endpoint": refused, "probe": PROBE}),
        ("ipv6-loopback", {"endpoint": "http://[::1]:9", "probe": PROBE}),
        (
            "huge-thresholds",
            {
                "endpoint": good_endpoint,
                "probe": {
                    "periodSeconds": 3600,
                    "timeoutSeconds": 3599,
                    "failureThreshold": 1000,
                    "successThreshold": 1000,
                },
            },
        ),
        ("unicode-model", {"endpoint": good_endpoint, "model": "模型-🚀-ünïcödé", "probe": PROBE}),
        ("zero-timeout", {"endpoint": good_endpoint, "probe": {**PROBE, "timeoutSeconds": 0}}),
        ("metadata", {"endpoint": "http://169.254.169.254", "probe": PROBE}),
        ("long-path", {"endpoint": good_endpoint + "/" + "p" * 1900, "probe": PROBE}),
        (long_name, {"endpoint": good_endpoint, "probe": PROBE}),
        ("drained", {"endpoint": good_endpoint, "drain": True, "probe": PROBE}),
        (
            "good",
            {
                "endpoint": good_endpoint,
                "model": "sim-model",
                "weight": 1_000_000,
                "maxModelLen": 100_000_000,
                "probe": PROBE,
            },
        ),
    ]
    objects = []
    for name, spec in shards:
        obj = shard(name, spec)
        obj["metadata"]["labels"] = labels
        obj["metadata"]["annotations"] = {"note": "ünïcödé ☃ " * 50}
        objects.append(obj)
    objects += [
        env(
            "env-unreachable",
            {"endpoint": refused, "episodeTimeoutSeconds": 86_400, "maxConcurrentEpisodes": 1_000_000, "probe": PROBE},
        ),
        fleet("odd", {"shardSelector": {"matchLabels": labels}, "minReadyShards": 1}),
        fleet("never-ready", {"shardSelector": {"matchLabels": labels}, "minReadyShards": 100_000}),
        fleet("everything", {"shardSelector": {}, "environmentServerSelector": {}}),
        fleet("nothing", {"shardSelector": {"matchExpressions": [{"key": "absent", "operator": "Exists"}]}}),
    ]
    return objects


def _names(obj: dict[str, Any]) -> set[str]:
    return {entry["name"] for entry in status_of(obj).get("shards", [])}


async def test_the_operator_survives_odd_but_valid_resources_and_keeps_reconciling(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    ns = fleet_namespace
    async with SimFleet(1, log_dir=tmp_path / "sim") as sims, api_client(fleet_crds.kubeconfig) as api:
        objects = odd_objects(sims.shards[0].endpoint)
        result = apply(fleet_crds, ns, *objects)
        admitted_zero_timeout = result.returncode == 0
        if not admitted_zero_timeout:  # the API server refuses a zero probe timeout: apply the rest
            assert "timeoutSeconds" in result.stderr, result.stderr
            objects = [o for o in objects if o["metadata"]["name"] != "zero-timeout"]
            assert apply(fleet_crds, ns, *objects).returncode == 0
        operator = OperatorProcess(fleet_crds, ns, tmp_path, identity="odd")
        operator_processes.append(operator)
        operator.start()
        await operator.wait_role("leader")

        healthy = {"good"} | {o["metadata"]["name"] for o in objects if o["metadata"]["name"].startswith("aaaa")}
        odd = await wait_for_object(api, "rolloutfleets", ns, "odd", lambda o: _names(o) == healthy)
        assert status_of(odd)["readyShards"] == len(healthy)
        good = next(e for e in status_of(odd)["shards"] if e["name"] == "good")
        assert (good["weight"], good["maxModelLen"]) == (1_000_000, 100_000_000)
        never = await wait_for_object(api, "rolloutfleets", ns, "never-ready", lambda o: bool(status_of(o)))
        ready = next(c for c in status_of(never)["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False"
        nothing = await wait_for_object(api, "rolloutfleets", ns, "nothing", lambda o: bool(status_of(o)))
        assert status_of(nothing)["totalShards"] == 0

        for name in ("unreachable", "ipv6-loopback", "metadata", "long-path", "unicode-model"):
            status = status_of(
                await wait_for_object(
                    api, "generationshards", ns, name, lambda o: status_of(o).get("phase") == "Unhealthy"
                )
            )
            assert status["lastError"], status
        unicode_status = status_of(
            await wait_for_object(api, "generationshards", ns, "unicode-model", lambda o: bool(status_of(o)))
        )
        assert "wrong_model" in unicode_status["lastError"]
        if admitted_zero_timeout:
            zero = await wait_for_object(
                api,
                "generationshards",
                ns,
                "zero-timeout",
                lambda o: "invalid spec" in (status_of(o).get("lastError") or ""),
            )
            assert status_of(zero)["phase"] == "Pending"
        drained = await wait_for_object(
            api, "generationshards", ns, "drained", lambda o: status_of(o).get("phase") == "Draining"
        )
        assert drained

        # Deleting the odd resources under a running operator is just as uneventful.
        fleet_crds.kubectl("delete", "generationshards", "--all", "-n", ns, "--wait=false")
        await wait_for_object(api, "rolloutfleets", ns, "odd", lambda o: status_of(o).get("totalShards") == 0)

        assert operator.process.running, operator.log_tail()
        assert (await operator.get("/healthz"))[0] == 200
    log = operator.process.log_path.read_text(errors="replace")
    assert "Traceback" not in log, operator.log_tail(120)
    TALLY["zero_probe_timeout_admitted_by_the_api_server"] = admitted_zero_timeout
