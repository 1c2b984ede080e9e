"""kopf handlers for PolicyVersions (the trainer's policy version and refits): every watch event goes to the engine."""

from __future__ import annotations

from typing import Any

import kopf

from rollout_runtime.kube import kinds

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(kinds.GROUP, kinds.VERSION, kinds.POLICY_VERSION.plural, registry=registry)
    async def policy_version_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        body: dict[str, Any] = dict(event.get("object") or {})
        meta = body.get("metadata") or {}
        if event.get("type") == "DELETED":
            memo.engine.forget_policy_version(meta.get("namespace", ""), meta.get("name", ""))
        else:
            await memo.engine.upsert_policy_version(body)
