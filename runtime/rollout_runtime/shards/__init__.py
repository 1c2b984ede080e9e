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

__all__ = [
    "DEFAULT_FLEET",
    "FLEET_LABEL",
    "HealthySet",
    "KubernetesShardSource",
    "LocalShardSource",
    "OwnerRef",
    "ReportsCompletions",
    "Shard",
    "ShardSource",
    "StaticShardSource",
    "fleet_identity",
    "revision_of",
]


def __getattr__(name: str) -> Any:
    """KubernetesShardSource is imported on first use: importing the runtime never imports kubernetes_asyncio."""
    if name == "KubernetesShardSource":
        from rollout_runtime.shards.kubernetes import KubernetesShardSource

        return KubernetesShardSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
