"""kopf handlers, one module per kind, registered on a fresh registry per operator run (see :func:`build_registry`).

Handlers are thin: each calls the engine's method for its kind and event (in ``memo.engine``: ``upsert_target``,
``delete_fleet``, ``upsert_pod``...), which decides. Only
``@kopf.on.event`` is used: no change-detection handlers, so kopf writes no annotations, no finalizers and no
``status.kopf`` to our objects; deleting a shard never waits for the operator.
"""

from __future__ import annotations

import kopf

from fleet_operator.handlers import (
    environment_servers,
    generation_shards,
    lifecycle,
    pods,
    policy_versions,
    rollout_fleets,
)

__all__ = ["build_registry"]


def build_registry(*, pod_discovery: bool = True) -> kopf.OperatorRegistry:
    """A registry with every handler of the operator (a fresh one per run, so tests can run it repeatedly);
    ``pod_discovery``: also watch Pods and EndpointSlices (fleets' ``shardPods``/``environmentServerPods``)."""
    registry = kopf.OperatorRegistry()
    lifecycle.register(registry)
    generation_shards.register(registry)
    environment_servers.register(registry)
    rollout_fleets.register(registry)
    policy_versions.register(registry)
    if pod_discovery:
        pods.register(registry)
    return registry
