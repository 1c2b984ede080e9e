"""Proof that helm works here: lint and template a tiny chart, and install it into the real apiserver."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from support.controlplane import ControlPlane
from support.helm import Helm


@pytest.fixture
def tiny_chart(tmp_path: Path) -> Path:
    """A chart with one ConfigMap whose data comes from values."""
    chart = tmp_path / "tiny"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        textwrap.dedent("""
        apiVersion: v2
        name: tiny
        description: A chart that proves helm works against the test control plane.
        version: 0.1.0
        appVersion: "1.0"
        icon: https://example.invalid/icon.png
    """)
    )
    (chart / "values.yaml").write_text("# Greeting stored in the ConfigMap.\nmessage: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        textwrap.dedent("""
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: {{ .Release.Name }}-tiny
          labels:
            app.kubernetes.io/managed-by: {{ .Release.Service }}
        data:
          message: {{ .Values.message | quote }}
    """)
    )
    return chart


def test_helm_lints_and_templates_a_tiny_chart(helm: Helm, tiny_chart: Path) -> None:
    helm.run("lint", "--strict", tiny_chart)
    rendered = list(yaml.safe_load_all(helm.run("template", "demo", tiny_chart, "--set", "message=hi").stdout))
    assert [(doc["kind"], doc["metadata"]["name"], doc["data"]) for doc in rendered if doc] == [
        ("ConfigMap", "demo-tiny", {"message": "hi"})
    ]


@pytest.mark.e2e
def test_helm_installs_a_chart_into_the_real_apiserver(
    helm: Helm, tiny_chart: Path, control_plane: ControlPlane
) -> None:
    namespace = control_plane.create_namespace(f"helm-{uuid.uuid4().hex[:8]}")
    helm.run(
        "install",
        "demo",
        tiny_chart,
        f"--namespace={namespace}",
        "--set",
        "message=installed",
        "--wait",
        "--timeout=60s",
        kubeconfig=control_plane.kubeconfig,
    )

    releases = json.loads(
        helm.run("list", f"--namespace={namespace}", "-o", "json", kubeconfig=control_plane.kubeconfig).stdout
    )
    assert [(r["name"], r["status"]) for r in releases] == [("demo", "deployed")]
    configmap = control_plane.kubectl_json("get", "configmap", "demo-tiny", f"--namespace={namespace}")
    assert configmap["data"] == {"message": "installed"}
