"""rollout-fleet runtime: the library embedded in the trainer's single controller.

Public names are re-exported here so users import from one place. The failure taxonomy is imported eagerly (it is
small and everything uses it); the dispatcher, shard sources and clients on first use, so that importing the package
inside a Ray worker or an environment server stays cheap.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from rollout_runtime.failures import (
    FailureClass,
    GenerationUnavailable,
    GymTransportError,
    NoHealthyShards,
    RolloutBatchTooSmall,
    RolloutDataFailure,
    RolloutFailure,
    RolloutInfraFailure,
    RolloutRedispatchExhausted,
    RolloutStall,
    RolloutTerminalDataFailure,
    RolloutTimeout,
    classify_rollout_failure,
    http_status_is_infra,
    picklable_failures,
    to_picklable_failure,
)

if TYPE_CHECKING:
    from rollout_runtime.adapters import DispatchedOpenAI
    from rollout_runtime.dispatch import Completed, DataFailed, Dispatcher, DispatchPolicy, DispatchSession, Skipped
    from rollout_runtime.environment import EnvironmentClient
    from rollout_runtime.generation import GenerationClient
    from rollout_runtime.metrics import RolloutMetrics
    from rollout_runtime.results import Completion, GenerationOptions
    from rollout_runtime.shards import (
        HealthySet,
        KubernetesShardSource,
        LocalShardSource,
        Shard,
        ShardSource,
        StaticShardSource,
    )

_LAZY: dict[str, str] = {
    "Completed": "rollout_runtime.dispatch",
    "DataFailed": "rollout_runtime.dispatch",
    "DispatchPolicy": "rollout_runtime.dispatch",
    "Dispatcher": "rollout_runtime.dispatch",
    "Skipped": "rollout_runtime.dispatch",
    "EnvironmentClient": "rollout_runtime.environment",
    "GenerationClient": "rollout_runtime.generation",
    "RolloutMetrics": "rollout_runtime.metrics",
    "HealthySet": "rollout_runtime.shards",
    "KubernetesShardSource": "rollout_runtime.shards",
    "LocalShardSource": "rollout_runtime.shards",
    "Shard": "rollout_runtime.shards",
    "ShardSource": "rollout_runtime.shards",
    "StaticShardSource": "rollout_runtime.shards",
    "DispatchSession": "rollout_runtime.dispatch",
    "Completion": "rollout_runtime.results",
    "GenerationOptions": "rollout_runtime.results",
    "DispatchedOpenAI": "rollout_runtime.adapters",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


try:
    __version__ = version("rollout-fleet")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = [
    "Completed",
    "Completion",
    "DataFailed",
    "DispatchPolicy",
    "DispatchSession",
    "DispatchedOpenAI",
    "Dispatcher",
    "EnvironmentClient",
    "FailureClass",
    "GenerationClient",
    "GenerationOptions",
    "GenerationUnavailable",
    "GymTransportError",
    "HealthySet",
    "KubernetesShardSource",
    "LocalShardSource",
    "NoHealthyShards",
    "RolloutBatchTooSmall",
    "RolloutDataFailure",
    "RolloutFailure",
    "RolloutInfraFailure",
    "RolloutMetrics",
    "RolloutRedispatchExhausted",
    "RolloutStall",
    "RolloutTerminalDataFailure",
    "RolloutTimeout",
    "Shard",
    "ShardSource",
    "Skipped",
    "StaticShardSource",
    "__version__",
    "classify_rollout_failure",
    "http_status_is_infra",
    "picklable_failures",
    "to_picklable_failure",
]
