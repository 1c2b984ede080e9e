"""kopf handlers for the built-in kinds pod members are discovered from (Pods, EndpointSlices): an upsert or delete
for each watch event, kept by the engine's pod membership as what :mod:`fleet_operator.discovery` reads of it.

Registered only with pod discovery on (``FLEET_OPERATOR_POD_DISCOVERY``, the default): the operator then needs
list and watch on pods and endpointslices, and nothing else on them (no write of any kind).
"""

from __future__ import annotations

from typing import Any

import kopf

from fleet_operator.handlers.common import apply
from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    pod, endpoint_slice = kinds.POD, kinds.ENDPOINT_SLICE

    @kopf.on.event(pod.group, pod.version, pod.plural, registry=registry)
    async def pod_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        await apply(event, upsert=memo.engine.upsert_pod, delete=memo.engine.delete_pod)

    @kopf.on.event(endpoint_slice.group, endpoint_slice.version, endpoint_slice.plural, registry=registry)
    async def endpoint_slice_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        await apply(event, upsert=memo.engine.upsert_endpoint_slice, delete=memo.engine.delete_endpoint_slice)
