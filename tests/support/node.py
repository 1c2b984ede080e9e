"""The cluster tier's node (``tools/node.py``) around a test session: up once, down at the end.

The node's supervisor runs as a child of pytest with a parent-death signal of SIGTERM, so even a pytest killed
outright makes it tear the node down (restore the sysctls, remove the bridge, nftables tables, mounts and cgroups);
a supervisor killed outright is cleaned up by the next ``up``, which runs ``down`` first. One node per machine: a
second session waits on the node's lock rather than sharing or breaking it. After teardown the fixture checks the
host is as it was before (``tools/node.py``'s ``host_state()``): a teardown that leaks fails the run, not the next
one. Both snapshots are the supervisor's, taken while it holds the lock (``--host-state``): one taken here, before
``up`` had the lock or after it let go, would see another session's node come or go and fail for it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import node as node_tool  # tools/node.py
from images import DOCKERFILE, dockerfile_spec, source_key
from support.processes import ManagedProcess, wait_until
from support.tools import REPO_ROOT, ToolMissingError, cache_root

NODE_PY = REPO_ROOT / "tools" / "node.py"
INSTALL_HINT_IMAGES = "bash scripts/install-tools.sh node-images"
UP_TIMEOUT = 600.0
"""Guards a hung start only: a warm node is up in 10-35 s on a loaded 2-core machine (more if another session's
node holds the machine's lock: this one waits for it)."""


@dataclass
class Node:
    kubeconfig: Path
    supervisor: ManagedProcess

    name: str = node_tool.NAME
    """The Node object's name (``kubectl cordon``...)."""

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True, text=True, timeout=timeout, check=False, input=stdin,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stderr}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs a real node of this machine (tools/node.py, as root)")


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A real node for the session (images built from this checkout), torn down at its end."""
    work = tmp_path_factory.mktemp("node")
    images = cache_root() / "images" / f"node-{source_key(dockerfile_spec(DOCKERFILE.read_text()))}"
    if not (images / ".complete").exists():
        raise ToolMissingError(f"the node's images for this checkout are not built: run `{INSTALL_HINT_IMAGES}`")
    ready, record = work / "ready", work / "host-state.json"
    setpriv = shutil.which("setpriv")
    assert setpriv is not None
    supervisor = ManagedProcess(
        "node",
        [
            setpriv,
            "--pdeathsig=TERM",
            "--",
            sys.executable,
            NODE_PY,
            "up",
            "--wait-lock",
            f"--ready-file={ready}",
            f"--images={images}",
            f"--host-state={record}",
        ],
        work / "node.log",
    )
    supervisor.start()
    try:
        wait_until(ready.exists, timeout=UP_TIMEOUT, what="the node to be up", process=supervisor)
        before = json.loads(record.read_text())["before"]
        assert node_tool.host_state() != before, "the node changed nothing on the host: is it up at all?"
        yield Node(Path(ready.read_text().strip()), supervisor)
    finally:
        supervisor.stop(timeout=120.0)
    assert supervisor.returncode == 0, supervisor.tail()
    states = json.loads(record.read_text())
    assert states.get("after") == states["before"], "the node did not leave the host as it found it"
