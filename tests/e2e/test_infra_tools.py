"""The installed tools are the pinned versions (a stale cache would silently test something else)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.tools import ToolMissingError, tool_path, versions


def version_output(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return result.stdout + result.stderr


def test_kube_apiserver_is_the_pinned_version() -> None:
    pin = versions()["KUBERNETES_VERSION"]
    assert f"Kubernetes v{pin}" in version_output(str(tool_path("kube-apiserver")), "--version")


def test_etcd_is_the_pinned_version() -> None:
    assert f"etcd Version: {versions()['ETCD_VERSION']}" in version_output(str(tool_path("etcd")), "--version")


def test_helm_is_the_pinned_version() -> None:
    assert f"v{versions()['HELM_VERSION']}" in version_output(str(tool_path("helm")), "version", "--short")


def test_prometheus_and_promtool_are_the_pinned_package() -> None:
    upstream = versions()["PROMETHEUS_VERSION"]
    assert f"version {upstream}" in version_output(str(tool_path("prometheus")), "--version")
    assert f"version {upstream}" in version_output(str(tool_path("promtool")), "--version")


def test_kubectl_is_found() -> None:
    assert "Client Version" in version_output(str(tool_path("kubectl")), "version", "--client")


def test_unknown_or_missing_tool_is_an_error_that_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ROLLOUT_FLEET_CACHE", str(tmp_path))
    with pytest.raises(ToolMissingError, match=r"scripts/install-tools\.sh"):
        tool_path("etcd")
