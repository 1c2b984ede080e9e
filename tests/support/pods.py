"""Pod objects as a kubelet would leave them (status included), for discovery tests and the e2e pods on the real
kube-apiserver (where the test writes the status the kubelet would)."""

from __future__ import annotations

from typing import Any

__all__ = ["pod"]


def pod(
    name: str = "vllm-0",
    *,
    uid: str = "u-0",
    ip: str | None = "10.1.0.5",
    ready: bool = True,
    restarts: tuple[int, ...] = (0,),
    labels: dict[str, str] | None = None,
    deleting: bool = False,
    phase: str = "Running",
    port: int = 8000,
    namespace: str = "ns",
) -> dict[str, Any]:
    """A Running pod (its status as the kubelet writes it) with container port ``http``."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "labels": labels or {"app": "vllm"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {
            "phase": phase,
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": f"c{i}", "restartCount": n} for i, n in enumerate(restarts)],
        },
    }
