"""kopf handlers for EnvironmentServers: a target's upsert or delete, for each watch event."""

from __future__ import annotations

import kopf

from fleet_operator.handlers.common import register_target
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    register_target(registry, kinds.ENVIRONMENT_SERVER)
