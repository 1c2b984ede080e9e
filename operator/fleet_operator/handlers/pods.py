"""kopf handlers for the built-in kinds pod members are discovered from (Pods, EndpointSlices): each watch event
is an upsert or a delete, kept by the engine's pod membership as what :mod:`fleet_operator.discovery` reads of it.

Registered only with pod discovery on (``FLEET_OPERATOR_POD_DISCOVERY``, the default): the operator then needs
list and watch on pods and endpointslices, and nothing else on them (no write of any kind).
"""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.engine import FleetEngine
from fleet_operator.handlers.common import watched
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    pod, endpoint_slice = kinds.POD, kinds.ENDPOINT_SLICE

    @kopf.on.event(pod.group, pod.version, pod.plural, registry=registry)
    async def pod_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        engine: FleetEngine = memo.engine
        seen = watched(event)
        if seen.deleted:
            await engine.delete_pod(seen.namespace, seen.name)
        else:
            await engine.upsert_pod(seen.body)

    @kopf.on.event(endpoint_slice.group, endpoint_slice.version, endpoint_slice.plural, registry=registry)
    async def endpoint_slice_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        engine: FleetEngine = memo.engine
        seen = watched(event)
        if seen.deleted:
            await engine.delete_endpoint_slice(seen.namespace, seen.name)
        else:
            await engine.upsert_endpoint_slice(seen.body)
