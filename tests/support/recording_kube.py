"""A KubeApi stand-in for engine tests: records each status it is asked to write, lists nothing."""

from __future__ import annotations

from typing import Any

from fleet_operator.kube import WriteOutcome


class RecordingKube:
    def __init__(self) -> None:
        self.statuses: dict[str, dict[str, Any]] = {}

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> WriteOutcome:
        self.statuses[name] = status
        return WriteOutcome.WRITTEN

    async def post_event(self, ref: Any, *, type_: str, reason: str, message: str) -> None:
        pass

    async def list_objects(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        return []
