"""Shard sets and where they come from (static, local probing, Kubernetes)."""

from typing import TYPE_CHECKING, Any

from rollout_runtime.shards.local import LocalShardSource
from rollout_runtime.shards.model import (
    DEFAULT_FLEET,
    HealthySet,
    ReportsCompletions,
    Shard,
    ShardSource,
    StaticShardSource,
    fleet_identity,
    revision_of,
)
from rollout_runtime.shards.registration import FLEET_LABEL, OwnerRef

if TYPE_CHECKING:
    from rollout_runtime.shards.kubernetes import KubernetesShardSource
    from rollout_runtime.shards.kubernetes_weights import FleetWeights, PolicyVersionWriter

__all__ = [
    "DEFAULT_FLEET",
    "FLEET_LABEL",
    "FleetWeights",
    "HealthySet",
    "KubernetesShardSource",
    "LocalShardSource",
    "OwnerRef",
    "PolicyVersionWriter",
    "ReportsCompletions",
    "Shard",
    "ShardSource",
    "StaticShardSource",
    "fleet_identity",
    "revision_of",
]


def __getattr__(name: str) -> Any:
    """Kubernetes parts are imported on first use: importing the runtime never imports kubernetes_asyncio."""
    if name == "KubernetesShardSource":
        from rollout_runtime.shards.kubernetes import KubernetesShardSource

        return KubernetesShardSource
    if name in ("FleetWeights", "PolicyVersionWriter"):
        from rollout_runtime.shards import kubernetes_weights

        return getattr(kubernetes_weights, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
