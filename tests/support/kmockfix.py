"""kmock's in-memory Kubernetes emulator for fast operator-logic tests (milliseconds, no real apiserver).

kmock's emulator stores objects as given; real clients (kopf among them) expect every stored object to carry a
``metadata.resourceVersion``, so :class:`VersionedKubernetesEmulator` stamps a growing one on each create and update.
The built-in resources are loaded from kmock's bundled discovery data; declare custom resources per test, e.g.
``kube_emulator.resources['rolloutfleet.dev/v1alpha1/rolloutfleets'] = {'kind': 'RolloutFleet', 'namespaced': True}``.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import pytest


@attrs.define(kw_only=True)
class VersionedKubernetesEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus a ``metadata.resourceVersion`` that grows on every create and update."""

    _versions: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if (
            request.resource is not None
            and request.action in (kmock.action.CREATE, kmock.action.UPDATE)
            and isinstance(request.data, dict)
        ):
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        return await super()._handle(request)

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig pointing at this emulator (plain HTTP on 127.0.0.1, no credentials)."""
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": str(self.url).rstrip("/")}}],
            "users": [{"name": "kmock", "user": {}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
            "current-context": "kmock",
        }
        path.write_text(json.dumps(config, indent=2))
        return path


@pytest.fixture
async def kube_emulator() -> AsyncIterator[VersionedKubernetesEmulator]:
    """A running kmock Kubernetes emulator on 127.0.0.1 with the bundled built-in resources loaded."""
    async with VersionedKubernetesEmulator() as emulator, kmock.Server(emulator):
        with warnings.catch_warnings():
            # kmock 0.8 reads its bundle with importlib.resources.read_binary, deprecated since Python 3.11.
            warnings.simplefilter("ignore", DeprecationWarning)
            emulator.resources.load_bundled()
        yield emulator
