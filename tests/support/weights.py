"""The fleet the weights e2e tests share (tests/e2e/test_weights_cluster.py, test_policy_version_cluster.py).

``weights_fleet(n)`` starts ``n`` sim shards (they speak SGLang's weights API), registers them as GenerationShards
of RolloutFleet ``a`` in the test's namespace with fast probes, creates the trainer's ServiceAccount bound to the
chart's trainer Role, and yields a :class:`WeightsFleet`: the admin API client, an HTTP session, the trainer's
kubeconfig, and the two calls a trainer makes on a shard (read its instance identity, push weights).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp
import pytest
from kubernetes_asyncio import client

from rollout_runtime.sim import SimFleet
from rollout_runtime.weights import SGLangWeightVersion, update_weights_from_disk
from support.controlplane import ControlPlane
from support.helm import Helm
from support.operator import api_client, fleet_objects
from support.trainer import trainer_kubeconfig

__all__ = ["PROBE", "WeightsFleet", "weights_fleet"]

PROBE: Final = {"periodSeconds": 0.5, "timeoutSeconds": 0.3, "failureThreshold": 2, "successThreshold": 2}


@dataclass
class WeightsFleet:
    """Sim shards registered as fleet ``a`` (see the module docstring)."""

    namespace: str
    sims: SimFleet
    plane: ControlPlane
    api: client.ApiClient
    """An admin client (the operator's and the test's view, never the trainer's)."""
    http: aiohttp.ClientSession
    trainer: Path
    """Kubeconfig of the trainer ServiceAccount: the chart's trainer Role and nothing more."""
    identity: SGLangWeightVersion = field(default_factory=SGLangWeightVersion)

    @property
    def names(self) -> set[str]:
        return set(self.sims.names)

    async def instance(self, name: str) -> str | None:
        """The shard's instance identity as SGLang reports it (``weight_version:<v>``; ``default`` after a start)."""
        return await self.identity.identity(self.http, name, self.sims.shard(name).endpoint)

    async def push(self, name: str, version: int) -> None:
        """The trainer's weight update: ``update_weights_from_disk`` to policy ``version``'s checkpoint."""
        await update_weights_from_disk(self.http, self.sims.shard(name).endpoint, f"/ckpt/step-{version}", version)


@pytest.fixture
def weights_fleet(
    fleet_crds: ControlPlane, fleet_namespace: str, helm: Helm, tmp_path: Path
) -> Callable[[int], AbstractAsyncContextManager[WeightsFleet]]:
    """``async with weights_fleet(n) as fleet:`` (a factory: each test picks its shard count)."""

    @asynccontextmanager
    async def start(shards: int) -> AsyncIterator[WeightsFleet]:
        trainer = trainer_kubeconfig(fleet_crds, helm, fleet_namespace)
        async with (
            SimFleet(shards, log_dir=tmp_path / "sim") as sims,
            api_client(fleet_crds.kubeconfig) as api,
            aiohttp.ClientSession() as http,
        ):
            fleet_crds.apply(*fleet_objects(sims.shards, PROBE), namespace=fleet_namespace)
            yield WeightsFleet(fleet_namespace, sims, fleet_crds, api, http, trainer)

    return start
