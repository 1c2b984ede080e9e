"""The chart's optional router: Deployment + Service + PDB + a Role that reads its one RolloutFleet, rendered with
the real helm and validated against the Kubernetes 1.35 schemas in strict mode."""

from __future__ import annotations

import subprocess
from typing import Any

import kubernetes_validate
import pytest

from support.chart import KUBE_VERSION, by_kind, render
from support.helm import Helm

ROUTER = ["--set", "router.enabled=true", "--set", "router.fleet=fleet-a", "--set", "router.fleetNamespace=rl-a"]


@pytest.fixture(scope="module")
def router_docs(helm: Helm) -> list[dict[str, Any]]:
    return render(helm, *ROUTER)


def _router(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == "rf-rollout-fleet-router"]
    return doc


def test_router_objects_pass_strict_kubernetes_validation(router_docs: list[dict[str, Any]]) -> None:
    kinds = set()
    for doc in router_docs:
        if doc["metadata"]["name"] == "rf-rollout-fleet-router":
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            kinds.add(doc["kind"])
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget", "ServiceAccount", "Role", "RoleBinding"}


def test_the_router_is_off_by_default(helm: Helm) -> None:
    assert not [d for d in render(helm) if d["metadata"]["name"].endswith("-router")]


def test_the_router_follows_its_fleet_and_reads_nothing_else(router_docs: list[dict[str, Any]]) -> None:
    deployment = _router(router_docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "router"
    assert "--fleet=fleet-a" in container["args"]
    assert "--namespace=rl-a" in container["args"]
    assert deployment["spec"]["replicas"] == 2
    role = _router(router_docs, "Role")
    assert role["metadata"]["namespace"] == "rl-a"
    assert role["rules"] == [
        {
            "apiGroups": ["rolloutfleet.dev"],
            "resources": ["rolloutfleets"],
            "resourceNames": ["fleet-a"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = _router(router_docs, "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rf-rollout-fleet-router", "namespace": "fleet-system"}
    ]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "rf-rollout-fleet-router"


def test_router_and_operator_selectors_never_match_each_others_pods(router_docs: list[dict[str, Any]]) -> None:
    router_pods = _router(router_docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    operator = next(d for d in by_kind(router_docs, "Deployment") if d["metadata"]["name"] == "rf-rollout-fleet")
    operator_pods = operator["spec"]["template"]["metadata"]["labels"]
    for doc in router_docs:
        selector = (doc.get("spec") or {}).get("selector")
        if doc["kind"] == "Service":
            labels = selector
        elif doc["kind"] in ("PodDisruptionBudget", "Deployment"):
            labels = selector["matchLabels"]
        else:
            continue
        ours = doc["metadata"]["name"].endswith("-router")
        matches_router = all(router_pods.get(k) == v for k, v in labels.items())
        matches_operator = all(operator_pods.get(k) == v for k, v in labels.items())
        assert (matches_router, matches_operator) == ((True, False) if ours else (False, True)), doc["metadata"]


def test_a_router_without_a_fleet_fails_saying_what_to_set(helm: Helm) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failure:
        render(helm, "--set", "router.enabled=true")
    assert "router.fleet" in failure.value.stderr


@pytest.mark.parametrize(
    ("override", "complaint"),
    [("router.maxAttempts=0", "maxAttempts"), ("router.fleet=Not_A_Name", "fleet"), ("router.port=70000", "port")],
)
def test_the_schema_refuses_bad_router_values(helm: Helm, override: str, complaint: str) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failure:
        render(helm, *ROUTER, "--set", override)
    assert "values don't meet the specifications of the schema" in failure.value.stderr
    assert complaint in failure.value.stderr
