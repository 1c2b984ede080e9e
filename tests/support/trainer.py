"""A trainer identity with exactly the chart's trainer Role (rbac.trainer.bindings), for e2e tests."""

from __future__ import annotations

from pathlib import Path

from support.chart import by_kind, render
from support.controlplane import ControlPlane
from support.helm import Helm

__all__ = ["trainer_kubeconfig"]


def trainer_kubeconfig(plane: ControlPlane, helm: Helm, namespace: str, name: str = "trainer") -> Path:
    """ServiceAccount ``name`` bound to the chart's trainer Role in ``namespace`` (rendered by helm, so the Role
    tested is the Role shipped); a kubeconfig with its real TokenRequest token."""
    docs = render(
        helm,
        "--set", f"rbac.trainer.bindings[0].namespace={namespace}",
        "--set", f"rbac.trainer.bindings[0].serviceAccount={name}",
        "--show-only", "templates/role-trainer.yaml",
    )  # fmt: skip
    assert [d["kind"] for d in docs] == ["Role", "RoleBinding"]
    plane.apply(*by_kind(docs, "Role"), *by_kind(docs, "RoleBinding"))
    return plane.service_account_kubeconfig(namespace, name)
