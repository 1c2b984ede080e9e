"""helm install into the real kube-apiserver, then the operator runs with the chart's ServiceAccount identity.

There is no kubelet, so the Deployment gets no pods; instead the test runs ``rollout-fleet operator`` as a real
process configured exactly like the installed Deployment's container (its env, read back from the API server), with
a TokenRequest token of the chart's ServiceAccount. Only what a pod gets from its node differs: the kubeconfig
(in-cluster service-account mount), the pod name (downward API), a free port, and loopback probing for the
simulated shards on 127.0.0.1. The operator then has to reconcile a fleet: list and watch the three kinds, patch
their status, post Events and hold the Lease — with nothing but the chart's RBAC. ``kubectl auth can-i --list`` for
that identity must equal the least-privilege table in docs/operations.md.
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from pathlib import Path

import pytest

from support.chart import CHART_DIR, documented_rbac
from support.chart_cluster import PLURALS, fleet_objects, fleet_status, install, pod_ids, start_operator
from support.controlplane import ControlPlane
from support.helm import Helm
from support.pod_user import SCRUBBED, PodUser, has_passwd_entry, process_ids
from support.processes import ManagedProcess, wait_until

pytestmark = pytest.mark.e2e

# What every authenticated identity may do (system:basic-user, system:discovery, system:public-info-viewer).
BUILTIN_RESOURCES = {
    "selfsubjectreviews.authentication.k8s.io",
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
}


def expected_can_i(scope: str) -> dict[str, set[str]]:
    """The documented rows of one scope, named the way `kubectl auth can-i --list` names resources."""
    expected = {}
    for (group, resource), (verbs, row_scope) in documented_rbac().items():
        if row_scope != scope:
            continue
        plural, _, subresource = resource.partition("/")
        name = f"{plural}.{group}" if group else plural
        expected[f"{name}/{subresource}" if subresource else name] = verbs
    return expected


def can_i_list(plane: ControlPlane, kubeconfig: Path, namespace: str) -> dict[str, set[str]]:
    """`kubectl auth can-i --list` in a namespace, as resource -> verbs (non-resource URLs left out)."""
    out = plane.kubectl("auth", "can-i", "--list", f"--namespace={namespace}", kubeconfig=kubeconfig).stdout
    granted: dict[str, set[str]] = {}
    for line in out.splitlines()[1:]:
        match = re.match(r"^(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$", line)
        if match:
            resource, _, names, verbs = match.groups()
            assert not names, f"unexpected resourceNames restriction in {line!r}"
            granted.setdefault(resource, set()).update(verbs.split())
    return granted


@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster-wide", "namespaced"])
def test_service_account_of_the_chart_runs_the_operator_and_reconciles_a_fleet(
    helm: Helm,
    control_plane: ControlPlane,
    sim_shards: list[tuple[ManagedProcess, int]],
    tmp_path: Path,
    namespaced: bool,
) -> None:
    installed = install(helm, control_plane, namespaced=namespaced)
    assert "Next step" in installed.install_output  # NOTES.txt
    assert "kubectl apply --server-side" in installed.install_output
    for plural in PLURALS:  # installed from the chart's crds/ (and served: install() waited)
        control_plane.kubectl("get", "crd", f"{plural}.rolloutfleet.dev")

    # What the identity may do equals the documented least-privilege set, and nothing beyond the built-ins.
    in_fleet_ns = can_i_list(control_plane, installed.kubeconfig, installed.fleet_namespace)
    in_release_ns = can_i_list(control_plane, installed.kubeconfig, installed.namespace)
    watched = expected_can_i("watched namespaces")
    lease = expected_can_i("release namespace")
    assert {r: v for r, v in in_fleet_ns.items() if r not in BUILTIN_RESOURCES} == watched
    assert {r: v for r, v in in_release_ns.items() if r not in BUILTIN_RESOURCES} == (
        lease if namespaced else watched | lease
    )

    # The operator, as the installed Deployment configures it, with only the chart's RBAC.
    control_plane.apply(*fleet_objects(installed.fleet_namespace, [port for _, port in sim_shards]))
    operator, port, identity = start_operator(control_plane, installed, tmp_path)
    try:
        wait_until(
            lambda: fleet_status(control_plane, installed.fleet_namespace).get("readyShards") == 2,
            timeout=60,
            what="fleet with 2 healthy shards",
            process=operator,
        )
        status = fleet_status(control_plane, installed.fleet_namespace)
        assert status["healthy"] == "2/2"
        assert [entry["name"] for entry in status["shards"]] == ["shard-0", "shard-1"]

        # A shard dies: its status, the fleet's healthy set and an Event are written with the chart's identity.
        sim_shards[1][0].kill()
        wait_until(
            lambda: fleet_status(control_plane, installed.fleet_namespace).get("readyShards") == 1,
            timeout=60,
            what="fleet down to 1 healthy shard",
            process=operator,
        )
        shard = control_plane.kubectl_json(
            "get", "generationshard", "shard-1", f"--namespace={installed.fleet_namespace}"
        )
        assert shard["status"]["phase"] == "Unhealthy"
        events = control_plane.kubectl_json("get", "events", f"--namespace={installed.fleet_namespace}")["items"]
        assert any(event["involvedObject"]["name"] == "shard-1" for event in events)

        lease_obj = control_plane.kubectl_json(
            "get", "lease", f"{installed.release}-rollout-fleet", f"--namespace={installed.namespace}"
        )
        assert lease_obj["spec"]["holderIdentity"] == identity

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            metrics = response.read().decode()
        assert f'fleet_healthy_shards{{fleet="e2e",namespace="{installed.fleet_namespace}"}} 1.0' in metrics
    finally:
        operator.stop()
    log = operator.log_path.read_text()
    assert "Forbidden" not in log, f"the chart's RBAC refused a call:\n{operator.tail(60)}"
    assert " 403" not in log, f"the chart's RBAC refused a call:\n{operator.tail(60)}"
    assert operator.popen is not None
    assert operator.popen.returncode == 0, operator.tail(60)
    released = control_plane.kubectl_json(
        "get", "lease", f"{installed.release}-rollout-fleet", f"--namespace={installed.namespace}"
    )
    assert not released["spec"].get("holderIdentity"), "the operator did not release the Lease on SIGTERM"


def test_the_operator_runs_as_the_pods_uid_with_no_passwd_entry_and_leads(
    helm: Helm,
    control_plane: ControlPlane,
    sim_shards: list[tuple[ManagedProcess, int]],
    tmp_path: Path,
) -> None:
    """Issue 36: in a pod the operator runs as the chart's uid 65532, which the image's /etc/passwd does not name,
    with no USER in its environment. kopf, left to find its own identity, called getpass.getuser() and crashed
    with ``KeyError: 'getpwuid(): uid not found'`` right after taking the Lease (CrashLoopBackOff)."""
    installed = install(helm, control_plane, namespaced=True)
    uid, gid = pod_ids(control_plane, installed)
    assert (uid, gid) == (65532, 65532)
    assert not has_passwd_entry(uid), "the fault needs a uid this machine cannot name"
    user = PodUser.create(uid, gid)
    try:
        control_plane.apply(*fleet_objects(installed.fleet_namespace, [port for _, port in sim_shards]))
        operator, _, identity = start_operator(control_plane, installed, tmp_path, pod_user=user)
        try:
            assert operator.pid is not None
            assert process_ids(operator.pid) == (uid, gid)  # the fault is in place: not root, no name
            assert operator.env is not None
            assert not set(SCRUBBED) & set(operator.env), "getpass would read these instead of the passwd database"
            wait_until(
                lambda: fleet_status(control_plane, installed.fleet_namespace).get("readyShards") == 2,
                timeout=60,
                what="fleet with 2 healthy shards, reconciled by the operator running as uid 65532",
                process=operator,
            )
            lease = control_plane.kubectl_json(
                "get", "lease", f"{installed.release}-rollout-fleet", f"--namespace={installed.namespace}"
            )
            assert lease["spec"]["holderIdentity"] == identity
        finally:
            operator.stop()
        assert operator.returncode == 0, operator.tail(60)
        assert "getpwuid" not in operator.log_path.read_text()
    finally:
        user.remove()


def test_reader_cluster_role_lets_a_trainer_read_its_fleet_and_nothing_else(
    helm: Helm, control_plane: ControlPlane
) -> None:
    installed = install(helm, control_plane, namespaced=False)
    suffix = installed.release.removeprefix("rf")
    trainer = control_plane.service_account_kubeconfig(installed.fleet_namespace, "trainer")
    control_plane.kubectl(
        "create",
        "rolebinding",
        "trainer-reads-fleet",
        f"--namespace={installed.fleet_namespace}",
        f"--clusterrole=rollout-fleet-reader-{suffix}",
        f"--serviceaccount={installed.fleet_namespace}:trainer",
    )
    granted = can_i_list(control_plane, trainer, installed.fleet_namespace)
    assert {r: v for r, v in granted.items() if r not in BUILTIN_RESOURCES} == {
        f"{plural}.rolloutfleet.dev": {"get", "list", "watch"}
        for plural in ("rolloutfleets", "generationshards", "environmentservers")
    }
    control_plane.kubectl("get", "rolloutfleets", f"--namespace={installed.fleet_namespace}", kubeconfig=trainer)


def test_documented_upgrade_path_applies_the_crds_then_upgrades_the_release(
    helm: Helm, control_plane: ControlPlane
) -> None:
    """docs/operations.md "Upgrade": kubectl apply --server-side of the chart's crds/, then helm upgrade."""
    installed = install(helm, control_plane, namespaced=False)
    applied = control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART_DIR / "crds")).stdout
    assert applied.count("serverside-applied") == len(PLURALS)
    helm.run(
        "upgrade",
        installed.release,
        CHART_DIR,
        "--namespace",
        installed.namespace,
        "--reuse-values",
        "--set",
        "replicaCount=2",
        kubeconfig=control_plane.kubeconfig,
    )
    deployment = control_plane.kubectl_json(
        "get", "deployment", f"{installed.release}-rollout-fleet", f"--namespace={installed.namespace}"
    )
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    history = helm.run(
        "history",
        installed.release,
        "--namespace",
        installed.namespace,
        "-o",
        "json",
        kubeconfig=control_plane.kubeconfig,
    ).stdout
    assert [entry["status"] for entry in json.loads(history)] == ["superseded", "deployed"]


def test_install_notes_print_the_next_commands(helm: Helm, control_plane: ControlPlane) -> None:
    """NOTES.txt, as `helm install` prints it: how to apply the examples, see the fleets, and reach the metrics."""
    namespace = control_plane.create_namespace(f"fleet-system-{uuid.uuid4().hex[:6]}")
    result = helm.run(
        "install", "rf-notes", CHART_DIR, "--namespace", namespace, "--dry-run=server",
        "--set", "operator.watchNamespaces[0]=rl-a", kubeconfig=control_plane.kubeconfig, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    notes = result.stdout.partition("NOTES:")[2]
    for command in (
        f"kubectl --namespace {namespace} rollout status deployment/rf-notes-rollout-fleet",
        "kubectl apply --namespace <fleet-namespace> -f examples/\n",
        "kubectl get rolloutfleets,generationshards,environmentservers --namespace rl-a",
        "rollout-fleet status <fleet> --namespace <fleet-namespace>",
        "--clusterrole=rollout-fleet-reader",
        f"kubectl --namespace {namespace} port-forward service/rf-notes-rollout-fleet-metrics 8080",
        "load rules/rollout-fleet.rules.yaml",
        "kubectl apply --server-side -f",
    ):
        assert command in notes, f"NOTES.txt lacks {command!r}:\n{notes}"
