"""Shard sets and where they come from (static, local probing, Kubernetes)."""

from rollout_runtime.shards.local import LocalShardSource
from rollout_runtime.shards.model import HealthySet, Shard, ShardSource, StaticShardSource, revision_of

__all__ = ["HealthySet", "LocalShardSource", "Shard", "ShardSource", "StaticShardSource", "revision_of"]
