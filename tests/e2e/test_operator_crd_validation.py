"""The generated CRDs on the real kube-apiserver: bad resources are rejected with messages that say what to fix,
good ones are defaulted, and kubectl shows the printer columns."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_operator.records import observe_target
from rollout_runtime.health import ProbeSettings
from support.controlplane import ControlPlane
from support.operator import ROLLOUT_FLEET_CLI

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
API = "rolloutfleet.dev/v1alpha1"


def shard(spec: dict[str, Any], name: str = "bad") -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GenerationShard", "metadata": {"name": name}, "spec": spec}


def env_server(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "EnvironmentServer", "metadata": {"name": "bad-env"}, "spec": spec}


def fleet(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "RolloutFleet", "metadata": {"name": "bad-fleet"}, "spec": spec}


OK = {"endpoint": "http://10.0.0.7:8000"}
SELECT = {"shardSelector": {"matchLabels": {"fleet": "a"}}}

INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "neither location",
        shard({"model": "m"}),
        "set exactly one of spec.serviceRef (an in-cluster Service) or spec.endpoint",
    ),
    ("both locations", shard({**OK, "serviceRef": {"name": "vllm"}}), "set exactly one of spec.serviceRef"),
    (
        "timeout not below period",
        shard({**OK, "probe": {"periodSeconds": 2, "timeoutSeconds": 2}}),
        "probe.timeoutSeconds must be less than probe.periodSeconds",
    ),
    (
        "period 1 with the old 2 s timeout",
        shard({**OK, "probe": {"periodSeconds": 1, "timeoutSeconds": 2}}),
        "probe.timeoutSeconds must be less than probe.periodSeconds, or probes of one target overlap",
    ),
    (
        "failure threshold zero",
        shard({**OK, "probe": {"failureThreshold": 0}}),
        "spec.probe.failureThreshold in body should be greater than or equal to 1",
    ),
    (
        "success threshold zero",
        shard({**OK, "probe": {"successThreshold": 0}}),
        "spec.probe.successThreshold in body should be greater than or equal to 1",
    ),
    ("endpoint not http", shard({"endpoint": "ftp://10.0.0.7/x"}), "spec.endpoint in body should match"),
    ("probe path relative", shard({**OK, "probe": {"path": "health"}}), "spec.probe.path in body should match"),
    (
        "probe path names a host",
        shard({**OK, "probe": {"path": "//169.254.169.254/latest"}}),
        "probe.path must be a path on the target like /health, not a host",
    ),
    ("zero weight", shard({**OK, "weight": 0}), "spec.weight in body should be greater than 0"),
    ("bad service name", shard({"serviceRef": {"name": "VLLM_0"}}), "spec.serviceRef.name in body should match"),
    (
        "environment server with both locations",
        env_server({**OK, "serviceRef": {"name": "env"}}),
        "set exactly one of spec.serviceRef",
    ),
    (
        "no episode concurrency",
        env_server({**OK, "maxConcurrentEpisodes": 0}),
        "spec.maxConcurrentEpisodes in body should be greater than or equal to 1",
    ),
    (
        "stall deadline within the attempt timeout",
        fleet({**SELECT, "policy": {"attemptTimeoutSeconds": 600, "stallDeadlineSeconds": 600}}),
        "policy.stallDeadlineSeconds must be greater than policy.attemptTimeoutSeconds",
    ),
    (
        "backoff max below initial",
        fleet({**SELECT, "policy": {"backoffInitialSeconds": 10, "backoffMaxSeconds": 1}}),
        "policy.backoffMaxSeconds must be at least policy.backoffInitialSeconds",
    ),
    (
        "In without values",
        fleet({"shardSelector": {"matchExpressions": [{"key": "zone", "operator": "In"}]}}),
        "operators In and NotIn need at least one value",
    ),
    ("unknown stall action", fleet({**SELECT, "policy": {"stallAction": "explode"}}), 'Unsupported value: "explode"'),
    (
        "replace with no replacement attempts",
        fleet({**SELECT, "policy": {"onDroppedPrompt": "replace", "maxReplacementAttempts": 0}}),
        "policy.onDroppedPrompt='replace' requires policy.maxReplacementAttempts >= 1",
    ),
    (
        "batch fraction of zero",
        fleet({**SELECT, "policy": {"minStepBatchFraction": 0}}),
        "minStepBatchFraction",
    ),
    (
        "no shard selector",
        fleet({"minReadyShards": 1}),
        "set spec.shardSelector (GenerationShard objects), spec.shardPods (pods), or both",
    ),
    (
        "pods by label and by service",
        fleet({"shardPods": {"selector": {}, "service": "vllm", "targetPort": {"number": 8000}}}),
        "set exactly one of selector (pods by label) or service",
    ),
    (
        "port by number and name",
        fleet({"shardPods": {"service": "vllm", "targetPort": {"number": 8000, "name": "http"}}}),
        "targetPort: set exactly one of number or name",
    ),
]


def apply(plane: ControlPlane, namespace: str, *objects: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    return plane.kubectl("apply", "-n", namespace, "-f", "-", input=document, check=False)


@pytest.mark.parametrize(("case", "obj", "message"), INVALID, ids=[case for case, _, _ in INVALID])
def test_invalid_resource_is_rejected_with_a_message_that_says_what_to_fix(
    fleet_crds: ControlPlane, case: str, obj: dict[str, Any], message: str
) -> None:
    result = apply(fleet_crds, "default", obj)
    assert result.returncode != 0, f"{case}: accepted"
    assert message in result.stderr, result.stderr


def test_distinct_invalid_cases_cover_every_kind() -> None:
    assert len(INVALID) >= 10
    assert {obj["kind"] for _, obj, _ in INVALID} == {"GenerationShard", "EnvironmentServer", "RolloutFleet"}


def test_examples_are_accepted_and_defaulted(fleet_crds: ControlPlane, fleet_namespace: str) -> None:
    documents = list(yaml.safe_load_all((REPO / "examples" / "fleet.yaml").read_text()))
    result = apply(fleet_crds, fleet_namespace, *documents)
    assert result.returncode == 0, result.stderr
    stored = fleet_crds.kubectl_json("get", "generationshard", "vllm-1", "-n", fleet_namespace)
    assert stored["spec"]["probe"] == {
        "path": "/health",
        "periodSeconds": 5,  # no timeoutSeconds: unset, it follows the period (2 s at 5 s)
        "failureThreshold": 3,
        "successThreshold": 2,
        "checkModel": True,  # a GenerationShard with a model checks /v1/models unless told not to
        "generate": False,  # the 1-token generation probe is opt-in
    }
    observed = observe_target("GenerationShard", stored, "cluster.local")
    assert observed.spec is not None
    assert observed.spec.probe.timeout_seconds == 2.0
    assert stored["spec"]["serviceRef"] == {"name": "vllm-1", "port": 8000, "scheme": "http"}
    policy = fleet_crds.kubectl_json("get", "rolloutfleet", "demo", "-n", fleet_namespace)["spec"]["policy"]
    assert (policy["stallAction"], policy["maxSkippedPrompts"], policy["healthyWaitSeconds"]) == ("abort", 0, 30)


def test_a_period_alone_is_accepted_and_the_operator_derives_the_timeout_from_it(
    fleet_crds: ControlPlane, fleet_namespace: str
) -> None:
    """``probe: {periodSeconds: 1}`` once got the CRD's 2 s timeout default and was then refused by the CEL rule;
    now the API server leaves the timeout unset and the operator reads min(2 s, period / 2), as the runtime does."""
    result = apply(fleet_crds, fleet_namespace, shard({**OK, "probe": {"periodSeconds": 1}}, name="fast"))
    assert result.returncode == 0, result.stderr
    stored = fleet_crds.kubectl_json("get", "generationshard", "fast", "-n", fleet_namespace)
    assert "timeoutSeconds" not in stored["spec"]["probe"], stored["spec"]["probe"]
    assert stored["spec"]["probe"]["failureThreshold"] == 3  # the other fields are still defaulted
    observed = observe_target("GenerationShard", stored, "cluster.local")
    assert observed.invalid is None, observed.invalid
    assert observed.spec is not None
    assert (observed.spec.probe.period_seconds, observed.spec.probe.timeout_seconds) == (1, 0.5)
    assert observed.spec.probe.timeout_seconds == ProbeSettings(period_seconds=1).timeout_seconds


def test_pod_examples_are_accepted_by_the_crds(fleet_crds: ControlPlane, fleet_namespace: str) -> None:
    fleets = [
        doc
        for path in sorted((REPO / "examples" / "pods").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc["kind"] == "RolloutFleet"
    ]
    assert len(fleets) == 3
    result = apply(fleet_crds, fleet_namespace, *fleets)
    assert result.returncode == 0, result.stderr
    stored = fleet_crds.kubectl_json("get", "rolloutfleet", "vllm", "-n", fleet_namespace)["spec"]["shardPods"]
    assert (stored["targetPort"], stored["scheme"], stored["weight"]) == ({"name": "http"}, "http", 1)


def test_kubectl_get_shows_the_printer_columns(fleet_crds: ControlPlane, fleet_namespace: str) -> None:
    ns = fleet_namespace
    selected = shard({**OK, "model": "sim-model"}, name="s0")
    selected["metadata"]["labels"] = {"fleet": "a"}
    assert apply(fleet_crds, ns, selected).returncode == 0
    assert apply(fleet_crds, ns, fleet(SELECT) | {"metadata": {"name": "a"}}).returncode == 0
    fleet_crds.kubectl(
        "patch", "generationshard", "s0", "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Healthy", "latencyMilliseconds": 12.5, "weightsVersion": 3}}),
    )  # fmt: skip
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "EnoughHealthyShards",
        "lastTransitionTime": "2025-01-01T00:00:00Z",
    }
    fleet_crds.kubectl(
        "patch", "rolloutfleet", "a", "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"healthy": "1/1", "staleShards": 1, "readyEnvironmentServers": 0,
                                     "conditions": [ready]}}),
    )  # fmt: skip
    shards = fleet_crds.kubectl("get", "gshard", "-n", ns).stdout.splitlines()
    assert shards[0].split() == ["NAME", "PHASE", "MODEL", "LATENCY-MS", "AGE"]
    assert shards[1].split()[:4] == ["s0", "Healthy", "sim-model", "12.5"]
    wide = fleet_crds.kubectl("get", "gshard", "-n", ns, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[:4] == ["NAME", "PHASE", "MODEL", "WEIGHTS"]
    assert wide[1].split()[:4] == ["s0", "Healthy", "sim-model", "3"]
    fleets = fleet_crds.kubectl("get", "rfleet", "-n", ns).stdout.splitlines()
    assert fleets[0].split() == ["NAME", "HEALTHY", "READY", "STALE", "ENVS", "AGE"]
    assert fleets[1].split()[:5] == ["a", "1/1", "True", "1", "0"]
    cli = subprocess.run(
        [ROLLOUT_FLEET_CLI, "status", "a", "-n", ns, "--kubeconfig", str(fleet_crds.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**fleet_crds.env(), "COLUMNS": "200"},
        check=True,
    )
    assert "healthy 1/1" in cli.stdout
    assert "EnoughHealthyShards" in cli.stdout
    assert "s0" in cli.stdout
    assert "Healthy" in cli.stdout
    category = fleet_crds.kubectl("get", "rollout-fleet", "-n", ns, "-o", "name").stdout.split()
    assert sorted(category) == ["generationshard.rolloutfleet.dev/s0", "rolloutfleet.rolloutfleet.dev/a"]
