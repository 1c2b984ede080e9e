"""helm, run with its config/cache/data homes in a temp dir so tests never read or write the user's helm setup."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from support.tools import tool_path


class Helm:
    """The pinned helm binary with isolated homes; ``kubeconfig`` is needed only for commands that reach a cluster."""

    def __init__(self, home: Path) -> None:
        self.binary = tool_path("helm")
        self.home = home

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """Environment for helm: isolated XDG-style homes, and KUBECONFIG when given."""
        env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return env

    def run(
        self,
        *args: str | os.PathLike[str],
        kubeconfig: Path | None = None,
        check: bool = True,
        timeout: float = 120.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run helm; raise CalledProcessError (with stdout and stderr) when it fails and ``check`` is set."""
        argv: Sequence[str] = [str(self.binary), *(os.fspath(a) for a in args)]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, input=input, env=self.env(kubeconfig)
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
        return result


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The pinned helm (fails, never skips, when it is not installed)."""
    return Helm(tmp_path_factory.mktemp("helm-home"))
