"""The cluster tier's helpers (tests/cluster/): the release it installs once, the waits, a container killed on the
host. The fixture ``installed`` is tests/cluster/conftest.py's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from support.chart import CHART_DIR
from support.helm import Helm
from support.node import Node

GUARD = 240.0
"""Guards a hung wait only (a pod is Ready in 1-2.5 s here, a fleet turns in two 5 s probe periods)."""

OPERATOR = "app.kubernetes.io/name=rollout-fleet,app.kubernetes.io/component=operator"
"""The operator pods' labels (fleet-system)."""
ROUTER = "app.kubernetes.io/name=rollout-fleet,app.kubernetes.io/component=router"
"""The router pods' labels (fleet-system), when the release enables the router."""


def until(what: str, check: Callable[[], Any], node: Node, guard: float = GUARD) -> Any:
    """Poll ``check`` until it returns something truthy; on the guard, fail saying what and showing the pods."""
    deadline = time.monotonic() + guard
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)  # polling the API for a condition, with a deadline
    pods = node.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}\n{pods}")


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@dataclass
class Installed:
    node: Node
    helm: Helm

    def fleet(self, name: str = "demo") -> dict[str, Any]:
        return dict(self.node.json("get", "rolloutfleet", name).get("status") or {})

    def pods(self, selector: str, namespace: str = "default") -> list[dict[str, Any]]:
        return list(self.node.json("get", "pods", "-l", selector, "-n", namespace)["items"])

    def ready_pods(self, selector: str, namespace: str = "default") -> list[dict[str, Any]]:
        return [
            pod
            for pod in self.pods(selector, namespace)
            if not pod["metadata"].get("deletionTimestamp") and is_ready(pod)
        ]

    def lease_holder(self) -> str:
        lease = self.node.json("get", "lease", "rollout-fleet", "-n", "fleet-system")
        return str(lease["spec"].get("holderIdentity") or "")

    def upgrade(self, *values: str) -> None:
        """``helm upgrade --reuse-values --set VALUE ... --wait``: the release as the tier's later tests need it."""
        sets = [arg for value in values for arg in ("--set", value)]
        self.helm.run(
            "upgrade", "rollout-fleet", CHART_DIR, "--namespace", "fleet-system", "--reuse-values", *sets,
            "--wait", "--timeout=300s", kubeconfig=self.node.kubeconfig, timeout=400,
        )  # fmt: skip


def container_pid(container_id: str) -> int:
    """The host pid of a container's process, from the node's containerd (this test runs on the node's machine)."""
    import node as node_tool  # tools/node.py

    ctr = node_tool.tool("containerd", "CONTAINERD_VERSION", "root", "usr", "bin", "ctr")
    address = f"--address={node_tool.RUN / 'containerd.sock'}"
    listing = [ctr, address, "--namespace=k8s.io", "tasks", "ls"]
    tasks = subprocess.run(listing, capture_output=True, text=True, check=True)
    for line in tasks.stdout.splitlines()[1:]:
        task, pid, status = line.split()
        if task == container_id and status == "RUNNING":
            return int(pid)
    raise AssertionError(f"container {container_id} is not running:\n{tasks.stdout}")


def sigkill_until_restarted(installed: Installed, pod: dict[str, Any]) -> dict[str, Any]:
    """SIGKILL the pod's one container on the host and wait for the kubelet to restart it in place, Ready again;
    return the pod as it is then. Proves the kill hit: restart count +1, last exit code 137."""
    (status,) = pod["status"]["containerStatuses"]
    os.kill(container_pid(status["containerID"].removeprefix("containerd://")), signal.SIGKILL)
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]

    def restarted() -> dict[str, Any] | None:
        now = installed.node.json("get", "pod", name, "-n", namespace)
        (container,) = now["status"]["containerStatuses"]
        return now if container["restartCount"] == status["restartCount"] + 1 and container["ready"] else None

    now = until(f"the kubelet to restart {name}'s killed container, Ready again", restarted, installed.node)
    (container,) = now["status"]["containerStatuses"]
    assert container["lastState"]["terminated"]["exitCode"] == 137, container["lastState"]  # the SIGKILL hit it
    assert now["metadata"]["uid"] == pod["metadata"]["uid"], "restarted in place, not replaced"
    assert now["status"]["podIP"] == pod["status"]["podIP"]
    return dict(now)
