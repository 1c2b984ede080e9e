"""The chart installed into the real control plane, and the operator run with the chart's identity and settings.

Shared by the install/RBAC test and the live observability test. There is no kubelet, so the Deployment gets no
pods: :func:`start_operator` runs ``rollout-fleet operator`` as a real process configured like the installed
Deployment's container (its env read back from the API server) with a TokenRequest token of the chart's
ServiceAccount; only what a pod gets from its node differs (kubeconfig, pod name, a free port, loopback probing for
the simulated shards on 127.0.0.1).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout_runtime.kube import kinds
from support.chart import CHART_DIR
from support.controlplane import ControlPlane
from support.helm import Helm
from support.pod_user import PodUser
from support.processes import ManagedProcess, free_port, wait_until

ROLLOUT_FLEET = str(Path(sys.executable).parent / "rollout-fleet")
PLURALS = tuple(names.plural for names in kinds.KINDS)


@dataclass
class Installed:
    release: str
    namespace: str
    fleet_namespace: str
    service_account: str
    kubeconfig: Path
    install_output: str


def install(helm: Helm, plane: ControlPlane, *, namespaced: bool, extra: tuple[str, ...] = ()) -> Installed:
    """helm install the chart (fresh namespaces and release name), wait until its CRDs are served."""
    suffix = uuid.uuid4().hex[:6]
    namespace = plane.create_namespace(f"fleet-system-{suffix}")
    fleet_namespace = plane.create_namespace(f"rl-{suffix}")
    release = f"rf{suffix}"
    args = ["--set", f"rbac.reader.name=rollout-fleet-reader-{suffix}", *extra]
    if namespaced:
        args += ["--set", f"operator.watchNamespaces[0]={fleet_namespace}"]
    result = helm.run(
        "install", release, CHART_DIR, "--namespace", namespace, *args, kubeconfig=plane.kubeconfig, check=False
    )
    assert result.returncode == 0, f"helm install failed:\n{result.stderr}"
    wait_for_crds(plane)
    service_account = f"{release}-rollout-fleet"
    kubeconfig = plane.service_account_kubeconfig(namespace, service_account, create=False)
    return Installed(release, namespace, fleet_namespace, service_account, kubeconfig, result.stdout)


def operator_env(plane: ControlPlane, installed: Installed, *, port: int, identity: str) -> dict[str, str]:
    """The installed Deployment's container env, plus what a pod would get from its node."""
    deployment = plane.kubectl_json(
        "get", "deployment", f"{installed.release}-rollout-fleet", f"--namespace={installed.namespace}"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {var["name"]: var["value"] for var in container["env"] if "value" in var}
    downward = {
        var["name"]: var["valueFrom"]["fieldRef"]["fieldPath"] for var in container["env"] if "valueFrom" in var
    }
    assert downward == {"POD_NAMESPACE": "metadata.namespace", "FLEET_OPERATOR_IDENTITY": "metadata.name"}
    env |= {"POD_NAMESPACE": installed.namespace, "FLEET_OPERATOR_IDENTITY": identity}
    env |= {
        "FLEET_OPERATOR_KUBECONFIG": str(installed.kubeconfig),  # in a pod: the mounted service-account token
        "FLEET_OPERATOR_HTTP_PORT": str(port),
        "FLEET_OPERATOR_HTTP_HOST": "127.0.0.1",
        "FLEET_OPERATOR_PROBE_ALLOW_LOOPBACK": "true",  # the simulated shards listen on 127.0.0.1
        "FLEET_OPERATOR_STATUS_HEARTBEAT_SECONDS": "2",
        "FLEET_OPERATOR_FLEET_COALESCE_SECONDS": "0.1",
    }
    return {"PATH": str(Path(sys.executable).parent), "HOME": str(Path.home()), **env}


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def wait_for_crds(plane: ControlPlane) -> None:
    """The three CRDs are Established and their storage answers (a new CRD answers 429 for a moment)."""
    for plural in PLURALS:
        plane.kubectl("wait", "--for=condition=Established", f"crd/{plural}.{kinds.GROUP}", "--timeout=60s")
        wait_until(
            lambda plural=plural: plane.kubectl("get", plural, "--all-namespaces", check=False).returncode == 0,  # type: ignore[misc]
            timeout=60,
            what=f"{plural} served",
        )


def pod_ids(plane: ControlPlane, installed: Installed) -> tuple[int, int]:
    """The uid and gid the installed Deployment's pods run as (its pod securityContext)."""
    deployment = plane.kubectl_json(
        "get", "deployment", f"{installed.release}-rollout-fleet", f"--namespace={installed.namespace}"
    )
    context = deployment["spec"]["template"]["spec"]["securityContext"]
    return int(context["runAsUser"]), int(context["runAsGroup"])


def start_operator(
    plane: ControlPlane,
    installed: Installed,
    log_dir: Path,
    *,
    port: int | None = None,
    pod_user: PodUser | None = None,
) -> tuple[ManagedProcess, int, str]:
    """Start the operator as the installed chart configures it; wait for /readyz. (process, port, identity).

    ``pod_user``: also as the pod's uid and gid, with no passwd entry and no USER in the environment."""
    port = port or free_port()
    identity = f"{installed.release}-pod-0"
    env = operator_env(plane, installed, port=port, identity=identity)
    argv: list[str] = [ROLLOUT_FLEET, "operator"]
    if pod_user is not None:
        env = pod_user.env(env) | {"FLEET_OPERATOR_KUBECONFIG": str(pod_user.kubeconfig(installed.kubeconfig))}
        argv = pod_user.argv("-m", "rollout_runtime.cli", "operator")
    operator = ManagedProcess("operator", argv, log_dir / "operator.log", env=env)
    operator.start()
    try:
        wait_until(
            lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200,
            timeout=60,
            what="operator /readyz",
            process=operator,
        )
    except BaseException:
        operator.stop()
        raise
    return operator, port, identity


@pytest.fixture
def sim_shards(tmp_path: Path) -> Iterator[list[tuple[ManagedProcess, int]]]:
    """Two simulated generation shards on 127.0.0.1 (real processes, stopped by pid)."""
    shards = []
    for index in range(2):
        port = free_port()
        process = ManagedProcess(
            f"sim-shard-{index}",
            [sys.executable, "-m", "rollout_runtime.cli.sim_shard", "--port", str(port), "--model", "sim-model"],
            tmp_path / f"sim-shard-{index}.log",
        )
        process.start()
        shards.append((process, port))
    try:
        for process, port in shards:
            wait_until(
                lambda port=port: http_status(f"http://127.0.0.1:{port}/health") == 200,  # type: ignore[misc]
                timeout=30,
                what=process.name,
                process=process,
            )
        yield shards
    finally:
        for process, _ in shards:
            process.stop()


def fleet_objects(namespace: str, ports: list[int]) -> list[dict[str, Any]]:
    probe = {"periodSeconds": 0.5, "timeoutSeconds": 0.4, "failureThreshold": 1, "successThreshold": 1}
    shards = [
        {
            "apiVersion": kinds.API_VERSION,
            "kind": "GenerationShard",
            "metadata": {"name": f"shard-{index}", "namespace": namespace, "labels": {"fleet": "e2e"}},
            "spec": {"endpoint": f"http://127.0.0.1:{port}", "model": "sim-model", "probe": probe},
        }
        for index, port in enumerate(ports)
    ]
    fleet = {
        "apiVersion": kinds.API_VERSION,
        "kind": "RolloutFleet",
        "metadata": {"name": "e2e", "namespace": namespace},
        "spec": {"shardSelector": {"matchLabels": {"fleet": "e2e"}}},
    }
    return [*shards, fleet]


def fleet_status(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = plane.kubectl_json("get", "rolloutfleet", "e2e", f"--namespace={namespace}").get(
        "status", {}
    )
    return status
