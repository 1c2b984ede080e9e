"""HealthMonitor's mappings are live read-only views, and any hashable name keys a target (the operator's typed key)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from rollout_runtime.health import HealthMonitor, HealthPhase, ProbeResult, ProbeSettings, ProbeTarget

SETTINGS = ProbeSettings(period_seconds=5, timeout_seconds=2, failure_threshold=1, success_threshold=1)


class Key(NamedTuple):
    kind: str
    name: str


class AlwaysUp:
    async def probe(self, endpoint: str, settings: ProbeSettings, *, expected_model: str | None = None) -> ProbeResult:
        return ProbeResult.success(at=1000.0)


async def test_the_views_are_read_only_and_follow_the_monitor() -> None:
    monitor = HealthMonitor([ProbeTarget("a", "http://a", SETTINGS)], AlwaysUp())
    states, last_ok_at, targets = monitor.states, monitor.last_ok_at, monitor.targets
    assert monitor.states is states, "one view, not a copy per access"
    with pytest.raises(TypeError):
        states["b"] = states["a"]  # type: ignore[index]
    await monitor.probe_round()
    monitor.set_targets([ProbeTarget("a", "http://a", SETTINGS), ProbeTarget("b", "http://b", SETTINGS)])
    assert set(states) == set(targets) == {"a", "b"}
    assert dict(last_ok_at) == {"a": 1000.0}
    monitor.set_targets([ProbeTarget("b", "http://b", SETTINGS)])
    assert set(states) == {"b"}
    assert dict(last_ok_at) == {}


async def test_targets_can_be_keyed_by_a_typed_name() -> None:
    key = Key("GenerationShard", "s0")
    monitor = HealthMonitor([ProbeTarget(key, "http://s0", SETTINGS)], AlwaysUp())
    probe_round = await monitor.probe_round()
    assert set(probe_round.results) == {key}
    assert probe_round.transitions[0][0] == key
    assert monitor.states[key].phase is HealthPhase.HEALTHY
    assert await monitor.set_draining(key, True) is not None
    assert monitor.states[key].phase is HealthPhase.DRAINING
