"""Each kind's kopf handler calls the engine's method for that kind and event: an upsert for a listed, added or
modified object, a delete for a deleted one (no kind passed around to be told apart again)."""

from __future__ import annotations

import inspect
from typing import Any

import kopf
import pytest

from fleet_operator.engine import FleetEngine
from fleet_operator.handlers import build_registry

BODY = {"metadata": {"namespace": "ns", "name": "x"}, "spec": {}}


class RecordingEngine:
    """Records the engine calls a handler makes (with the real engine's method names and arguments)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(FleetEngine, name)  # a handler may only call what the engine has

        def record(*args: Any) -> Any:
            inspect.signature(real).bind(self, *args)
            self.calls.append((name, args))
            if inspect.iscoroutinefunction(real):

                async def done() -> None:
                    return None

                return done()
            return None

        return record


def _handlers() -> dict[str, Any]:
    registry = build_registry(pod_discovery=True)
    return {handler.selector.any_name: handler.fn for handler in registry._watching.get_all_handlers()}


@pytest.mark.parametrize(
    ("plural", "upserted", "deleted"),
    [
        ("generationshards", ("upsert_target", ("GenerationShard", BODY)), ("delete_target", ("GenerationShard",))),
        (
            "environmentservers",
            ("upsert_target", ("EnvironmentServer", BODY)),
            ("delete_target", ("EnvironmentServer",)),
        ),
        ("rolloutfleets", ("upsert_fleet", (BODY,)), ("delete_fleet", ())),
        ("policyversions", ("upsert_policy_version", (BODY,)), ("delete_policy_version", ())),
        ("pods", ("upsert_pod", (BODY,)), ("delete_pod", ())),
        ("endpointslices", ("upsert_endpoint_slice", (BODY,)), ("delete_endpoint_slice", ())),
    ],
)
async def test_each_kinds_handler_calls_the_engines_method_for_it(
    plural: str, upserted: tuple[str, tuple[Any, ...]], deleted: tuple[str, tuple[Any, ...]]
) -> None:
    handler = _handlers()[plural]
    engine = RecordingEngine()
    memo = kopf.Memo(engine=engine)
    for kind in ("ADDED", "MODIFIED", None):  # None: kopf's initial listing
        await handler(event={"type": kind, "object": BODY}, memo=memo)
    await handler(event={"type": "DELETED", "object": BODY}, memo=memo)
    method, args = deleted
    assert engine.calls == [upserted] * 3 + [(method, (*args, "ns", "x"))]


def test_every_watched_kind_has_exactly_one_handler() -> None:
    registry = build_registry(pod_discovery=True)
    plurals = [handler.selector.any_name for handler in registry._watching.get_all_handlers()]
    assert sorted(plurals) == sorted(set(plurals))
    without_pods = build_registry(pod_discovery=False)._watching.get_all_handlers()
    assert {h.selector.any_name for h in without_pods} == set(plurals) - {"pods", "endpointslices"}
