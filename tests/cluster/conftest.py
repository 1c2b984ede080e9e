"""The cluster tier's one node and one helm install, shared by its modules.

The modules run in file-name order: ``test_cluster_node_lock.py`` first (no node: it holds the machine-wide lock
itself), then on the one install ``test_cluster_quickstart.py`` (the README's quickstart, pods deleted, killed and
scaled), ``test_cluster_shard_pods.py`` (pod members, refits, drains, the router, RBAC and Prometheus, after one
``helm upgrade``) and ``test_cluster_upgrade.py`` (two replicas, the PDB, ``helm uninstall``), which must stay last.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from support.cluster import Installed
from support.helm import Helm
from support.node import Node
from support.tools import REPO_ROOT


@pytest.fixture(scope="session")
def installed(node: Node, helm: Helm) -> Iterator[Installed]:
    """The README's quickstart, run as its script; uninstalled by the tier's last test (CRDs kept, as Helm keeps
    them)."""
    env = {**os.environ, "KUBECONFIG": str(node.kubeconfig), "HELM": str(helm.binary), **helm.env(node.kubeconfig)}
    done = subprocess.run(
        [REPO_ROOT / "scripts" / "cluster-quickstart"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"the quickstart failed:\n{done.stdout}\n{done.stderr}"
    assert "demo" in done.stdout
    yield Installed(node, helm)
    node.kubectl("delete", "-f", str(REPO_ROOT / "examples"), "--wait=false", check=False)
