"""Least privilege, proven by real requests: the chart's identities try what they must not do and are refused.

`kubectl auth can-i --list` (tests/e2e/test_chart_install.py) shows what the rules grant; this file makes the actual
API calls an attacker holding the operator's or a trainer's token would make, on the real kube-apiserver with the
chart installed by helm, and expects 403 for each. One allowed call per identity proves the token itself works, so
a refusal is RBAC's, not a broken credential's.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.chaos import report_dir
from support.chart import CHART_DIR
from support.controlplane import ControlPlane
from support.helm import Helm

pytestmark = pytest.mark.e2e

API = "rolloutfleet.dev/v1alpha1"


@dataclass(frozen=True)
class Installed:
    release: str
    namespace: str
    fleet_namespace: str
    other_namespace: str
    operator: Path
    trainer: Path


@pytest.fixture(scope="module")
def installed(helm: Helm, control_plane: ControlPlane) -> Iterator[Installed]:
    """The chart installed cluster-wide; a fleet namespace with one shard and fleet; a trainer bound to the reader
    role in that namespace only; and an unrelated namespace with a Secret and a ConfigMap worth stealing."""
    suffix = uuid.uuid4().hex[:6]
    namespace = control_plane.create_namespace(f"rbac-system-{suffix}")
    fleet_ns = control_plane.create_namespace(f"rbac-fleet-{suffix}")
    other_ns = control_plane.create_namespace(f"rbac-other-{suffix}")
    release = f"rbac{suffix}"
    reader = f"rollout-fleet-reader-{suffix}"
    helm.run(
        "install", release, CHART_DIR, "--namespace", namespace, "--set", f"rbac.reader.name={reader}",
        kubeconfig=control_plane.kubeconfig,
    )  # fmt: skip
    for plural in ("generationshards", "environmentservers", "rolloutfleets"):
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{plural}.rolloutfleet.dev", "--timeout=60s")
    control_plane.apply(
        {"apiVersion": API, "kind": "GenerationShard", "metadata": {"name": "s0"},
         "spec": {"endpoint": "http://10.0.0.7:8000"}},
        {"apiVersion": API, "kind": "RolloutFleet", "metadata": {"name": "f"}, "spec": {"shardSelector": {}}},
        namespace=fleet_ns,
    )  # fmt: skip
    for ns in (fleet_ns, other_ns, namespace):
        control_plane.apply(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "crown-jewels"}, "stringData": {"k": "v"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"k": "v"}},
            namespace=ns,
        )
    operator = control_plane.service_account_kubeconfig(namespace, f"{release}-rollout-fleet", create=False)
    trainer = control_plane.service_account_kubeconfig(fleet_ns, "trainer")
    control_plane.kubectl(
        "create", "rolebinding", "trainer-reads-fleet", f"--namespace={fleet_ns}", f"--clusterrole={reader}",
        f"--serviceaccount={fleet_ns}:trainer",
    )  # fmt: skip
    yield Installed(release, namespace, fleet_ns, other_ns, operator, trainer)
    helm.run("uninstall", release, "--namespace", namespace, kubeconfig=control_plane.kubeconfig, check=False)


def token_of(kubeconfig: Path) -> str:
    return str(json.loads(kubeconfig.read_text())["users"][0]["user"]["token"])


def request(
    plane: ControlPlane, kubeconfig: Path, method: str, path: str, body: object = None, **headers: str
) -> tuple[int, str]:
    """One real API request with the identity's bearer token; the HTTP status and the server's message."""
    data = json.dumps(body).encode() if body is not None else None
    content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
    req = urllib.request.Request(
        plane.url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token_of(kubeconfig)}", "Content-Type": content_type, **headers},
    )
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as response:
            return int(response.status), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read() or b"{}").get("message", "")


CR = f"/apis/{API}/namespaces"
SHARD = {"apiVersion": API, "kind": "GenerationShard", "metadata": {"name": "injected"},
         "spec": {"endpoint": "http://10.0.0.9:8000"}}  # fmt: skip
STATUS = {"status": {"phase": "Healthy"}}
EVIL_SPEC = {"spec": {"endpoint": "http://169.254.169.254"}}
LABEL = {"metadata": {"labels": {"pwned": "yes"}}}
Call = tuple[str, str, object]


def operator_denials(i: Installed) -> dict[str, Call | tuple[str, str, object, dict[str, str]]]:
    """What the operator's identity must not do: read secrets or config, touch workloads, change any spec or
    metadata, grant itself more, or write leases, events or statuses beyond what it needs."""
    f, o, r = i.fleet_namespace, i.other_namespace, i.namespace
    sa = f"{i.release}-rollout-fleet"
    return {
        "read a Secret in a fleet namespace": ("GET", f"/api/v1/namespaces/{f}/secrets/crown-jewels", None),
        "read a Secret in its own namespace": ("GET", f"/api/v1/namespaces/{r}/secrets/crown-jewels", None),
        "list Secrets cluster-wide": ("GET", "/api/v1/secrets", None),
        "read a ConfigMap": ("GET", f"/api/v1/namespaces/{o}/configmaps/settings", None),
        "change a ConfigMap": ("PATCH", f"/api/v1/namespaces/{o}/configmaps/settings", {"data": {"k": "x"}}),
        # list/watch of pods and endpointslices are granted (pod members); nothing else on them is
        "get one Pod by name": ("GET", f"/api/v1/namespaces/{f}/pods/nope", None),
        "delete a Pod": ("DELETE", f"/api/v1/namespaces/{f}/pods/nope", None),
        "create an EndpointSlice": ("POST", f"/apis/discovery.k8s.io/v1/namespaces/{f}/endpointslices", {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "evil"},
            "addressType": "IPv4", "endpoints": []}),
        "create a Pod": ("POST", f"/api/v1/namespaces/{f}/pods", {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "evil"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        "patch a Pod's status": ("PATCH", f"/api/v1/namespaces/{f}/pods/nope/status", STATUS),
        "get one shard by name": ("GET", f"{CR}/{f}/generationshards/s0", None),
        "change a shard's spec": ("PATCH", f"{CR}/{f}/generationshards/s0", EVIL_SPEC),
        "label a fleet": ("PATCH", f"{CR}/{f}/rolloutfleets/f", LABEL),
        "replace a status (update, not patch)": ("PUT", f"{CR}/{f}/generationshards/s0/status", SHARD),
        "create a shard": ("POST", f"{CR}/{f}/generationshards", SHARD),
        "delete a shard": ("DELETE", f"{CR}/{f}/generationshards/s0", None),
        "delete a fleet": ("DELETE", f"{CR}/{f}/rolloutfleets/f", None),
        "delete the CRD": ("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                     "generationshards.rolloutfleet.dev", None),
        "list CRDs": ("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", None),
        "bind cluster-admin to itself": ("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "pwn"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": r}]}),
        "impersonate the admin": ("GET", f"{CR}/{f}/rolloutfleets", None, {"Impersonate-User": "admin"}),
        "mint a token for another account": ("POST", f"/api/v1/namespaces/{f}/serviceaccounts/trainer/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
        "read Events": ("GET", f"/api/v1/namespaces/{f}/events", None),
        "delete Events": ("DELETE", f"/api/v1/namespaces/{f}/events", None),
        "take a Lease in a fleet namespace": ("POST", f"/apis/coordination.k8s.io/v1/namespaces/{f}/leases", {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "squat"}, "spec": {}}),
        "delete its own Lease": ("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{r}/leases/{sa}", None),
    }  # fmt: skip


def trainer_denials(i: Installed) -> dict[str, Call]:
    f = i.fleet_namespace
    return {
        "forge the fleet's healthy set (status)": ("PATCH", f"{CR}/{f}/rolloutfleets/f/status", STATUS),
        "patch a shard's status": ("PATCH", f"{CR}/{f}/generationshards/s0/status", STATUS),
        "change a shard's spec": ("PATCH", f"{CR}/{f}/generationshards/s0", EVIL_SPEC),
        "label the fleet": ("PATCH", f"{CR}/{f}/rolloutfleets/f", LABEL),
        "create a shard": ("POST", f"{CR}/{f}/generationshards", SHARD),
        "delete the fleet": ("DELETE", f"{CR}/{f}/rolloutfleets/f", None),
        "read a Secret in its own namespace": ("GET", f"/api/v1/namespaces/{f}/secrets/crown-jewels", None),
        "read fleets in another namespace": ("GET", f"{CR}/{i.other_namespace}/rolloutfleets", None),
        "list fleets cluster-wide": ("GET", f"/apis/{API}/rolloutfleets", None),
        "post an Event": ("POST", f"/api/v1/namespaces/{f}/events", {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "fake"}, "involvedObject": {"kind": "RolloutFleet", "name": "f", "namespace": f},
            "reason": "Fake", "message": "forged"}),
        "list Pods": ("GET", f"/api/v1/namespaces/{f}/pods", None),
    }  # fmt: skip


def _refuse_all(plane: ControlPlane, kubeconfig: Path, calls: dict[str, tuple[object, ...]]) -> dict[str, str]:
    refused: dict[str, str] = {}
    for what, call in calls.items():
        method, path, body = call[0], call[1], call[2]
        headers = call[3] if len(call) > 3 else {}
        status, message = request(plane, kubeconfig, str(method), str(path), body, **headers)  # type: ignore[arg-type]
        assert status == 403, f"{what}: {method} {path} answered {status} {message}"
        refused[what] = message[:200]
    return refused


def test_the_operator_identity_is_refused_everything_beyond_its_job(
    control_plane: ControlPlane, installed: Installed
) -> None:
    i = installed
    f = i.fleet_namespace
    status, message = request(control_plane, i.operator, "PATCH", f"{CR}/{f}/generationshards/s0/status", STATUS)
    assert status == 200, f"the operator's token cannot even patch a status: {message}"
    assert request(control_plane, i.operator, "GET", f"{CR}/{f}/generationshards")[0] == 200
    refused = _refuse_all(control_plane, i.operator, operator_denials(i))  # type: ignore[arg-type]
    assert (
        control_plane.kubectl_json("get", "generationshard", "s0", "-n", f)["spec"]["endpoint"]
        == "http://10.0.0.7:8000"
    )
    _record("operator", refused)


def test_the_trainer_reader_role_reads_its_fleet_and_cannot_write_anything(
    control_plane: ControlPlane, installed: Installed
) -> None:
    i = installed
    f = i.fleet_namespace
    assert request(control_plane, i.trainer, "GET", f"{CR}/{f}/rolloutfleets/f")[0] == 200
    assert request(control_plane, i.trainer, "GET", f"{CR}/{f}/generationshards?watch=false")[0] == 200
    refused = _refuse_all(control_plane, i.trainer, trainer_denials(i))  # type: ignore[arg-type]
    stored = control_plane.kubectl_json("get", "rolloutfleet", "f", "-n", f)
    assert "pwned" not in stored["metadata"].get("labels", {})
    _record("trainer", refused)


def _record(identity: str, refused: dict[str, str]) -> None:
    directory = report_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "rbac.json"
    data = json.loads(path.read_text()) if path.exists() else {"scenario": "rbac"}
    data[identity] = {"refused": len(refused), "requests": refused}
    path.write_text(json.dumps(data, indent=2) + "\n")
