"""Identities with exactly the Roles the chart renders (the trainer's, the operator's), for e2e tests.

Each is rendered by the real helm binary from charts/rollout-fleet, so the Role a test runs under is the Role
shipped, and a test that needs more than the chart grants fails with a Forbidden.
"""

from __future__ import annotations

from pathlib import Path

from support.chart import by_kind, render
from support.controlplane import ControlPlane
from support.helm import Helm

__all__ = ["chart_role_kubeconfig", "operator_kubeconfig", "trainer_kubeconfig"]


def chart_role_kubeconfig(
    plane: ControlPlane, helm: Helm, namespace: str, name: str, *values: str, templates: tuple[str, ...], roles: int
) -> Path:
    """ServiceAccount ``name`` bound to the ``roles`` Roles that ``templates`` render with ``values`` (helm
    ``--set`` pairs) for a release in ``namespace``; a kubeconfig with its real TokenRequest token."""
    shown = [arg for template in templates for arg in ("--show-only", f"templates/{template}")]
    docs = render(helm, *(arg for value in values for arg in ("--set", value)), *shown, namespace=namespace)
    assert sorted(d["kind"] for d in docs) == ["Role"] * roles + ["RoleBinding"] * roles, docs
    plane.apply(*by_kind(docs, "Role"), *by_kind(docs, "RoleBinding"))
    return plane.service_account_kubeconfig(namespace, name)


def trainer_kubeconfig(plane: ControlPlane, helm: Helm, namespace: str, name: str = "trainer") -> Path:
    """ServiceAccount ``name`` bound to the chart's trainer Role in ``namespace`` (``rbac.trainer.bindings``)."""
    return chart_role_kubeconfig(
        plane, helm, namespace, name,
        f"rbac.trainer.bindings[0].namespace={namespace}", f"rbac.trainer.bindings[0].serviceAccount={name}",
        templates=("role-trainer.yaml",), roles=1,
    )  # fmt: skip


def operator_kubeconfig(plane: ControlPlane, helm: Helm, namespace: str, name: str = "operator") -> Path:
    """The operator's ServiceAccount ``name`` with the chart's namespaced-mode Roles: the operator's rules in
    ``namespace`` (``operator.watchNamespaces``) and the leader-election Lease Role (the release namespace, also
    ``namespace``), with the chart's defaults otherwise (pod discovery on)."""
    return chart_role_kubeconfig(
        plane, helm, namespace, name,
        f"operator.watchNamespaces[0]={namespace}", f"serviceAccount.name={name}",
        templates=("role.yaml", "rolebinding.yaml"), roles=2,
    )  # fmt: skip
