"""Locate the external tools the tests run for real.

Versions come from ``tools/versions.env`` (the one place they are pinned); binaries from the cache that
``scripts/install-tools.sh`` fills (``$ROLLOUT_FLEET_CACHE/tools/<name>-<version>/bin``). A missing tool raises
:class:`ToolMissingError` with the command that installs it: tests that need a tool fail loudly, they never skip.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest

import pins

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run `bash scripts/install-tools.sh` (scripts/test does it before pytest)"

# binary name -> (install directory prefix, versions.env key)
_CACHED_TOOLS: dict[str, tuple[str, str]] = {
    "kube-apiserver": ("kube-apiserver", "KUBERNETES_VERSION"),
    "kube-controller-manager": ("kube-controller-manager", "KUBERNETES_VERSION"),
    "etcd": ("etcd", "ETCD_VERSION"),
    "helm": ("helm", "HELM_VERSION"),
    "prometheus": ("prometheus", "PROMETHEUS_VERSION"),
    "promtool": ("prometheus", "PROMETHEUS_VERSION"),
}


class ToolMissingError(RuntimeError):
    """A tool the test needs is not installed; the message says how to install it."""


versions = functools.cache(pins.versions)
"""The pinned versions, parsed from the same KEY=value file the install script sources (tools/pins.py reads it)."""


def cache_root() -> Path:
    """Where install-tools.sh keeps tools and Go caches (outside the checkout)."""
    return Path(os.environ.get("ROLLOUT_FLEET_CACHE", Path.home() / ".cache" / "rollout-fleet"))


def helm_kube_version() -> str:
    """The Kubernetes major.minor stamped into helm (what it assumes offline): the pinned control plane's."""
    return ".".join(versions()["KUBERNETES_VERSION"].split(".")[:2])


def _build_suffix(prefix: str) -> str:
    """helm's install directory also names its stamped Kubernetes version (install-tools.sh, build_helm)."""
    return f"-k8s{helm_kube_version()}" if prefix == "helm" else ""


def tool_path(name: str) -> Path:
    """The path of an installed tool binary, or ToolMissingError naming the missing piece and the fix."""
    if name == "kubectl":
        found = os.environ.get("KUBECTL") or shutil.which("kubectl")
        if not found:
            raise ToolMissingError(f"kubectl is not on PATH (nor in $KUBECTL): install it; {INSTALL_HINT} checks it")
        return Path(found)
    if name not in _CACHED_TOOLS:
        raise KeyError(f"unknown tool {name!r}; known: kubectl, {', '.join(_CACHED_TOOLS)}")
    prefix, key = _CACHED_TOOLS[name]
    version = versions()[key]
    tool_dir = cache_root() / "tools" / f"{prefix}-{version}{_build_suffix(prefix)}"
    binary = tool_dir / "bin" / name
    if not (tool_dir / ".complete").is_file() or not os.access(binary, os.X_OK):
        raise ToolMissingError(f"{name} {version} is not installed at {binary}: {INSTALL_HINT}")
    return binary


def openssl_path() -> Path:
    """openssl generates the control plane's certificates and service-account keys."""
    found = shutil.which("openssl")
    if not found:
        raise ToolMissingError("openssl is not on PATH: install it (Debian: `apt-get install openssl`)")
    return Path(found)


@pytest.fixture(scope="session")
def tool_versions() -> dict[str, str]:
    """The pinned tool versions from tools/versions.env."""
    return versions()
