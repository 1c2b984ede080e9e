"""The operator's writer at fleet scale: what bench/operator_scale.py found on the real apiserver, pinned down.

At 1,000 shards the status PATCHes of one writer pass are many. A fleet's status (what trainers read) must not wait
behind a wave of target heartbeats, the PATCHes of a sweep must overlap (bounded), and priming must not rebuild the
probe list once per listed object (quadratic). A fake KubeApi controls when each PATCH finishes: no sleeps, no clocks.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fleet_operator.engine import FleetEngine
from fleet_operator.kube import WriteOutcome
from fleet_operator.settings import OperatorSettings
from rollout_runtime.health import HealthPhase, ProbeReason, ProbeResult, ProbeSettings
from support.deadlines import within

NS = "bench"
HEARTBEAT = 60.0
PROBE = {"periodSeconds": 5, "timeoutSeconds": 1, "failureThreshold": 1, "successThreshold": 1}


class FakeApi:
    """Records every status PATCH in order; ``gate`` (when set up) holds each PATCH until released."""

    def __init__(self, shards: int, *, drained: frozenset[str] = frozenset()) -> None:
        self.shards = shards
        self.drained = drained
        self.patches: list[tuple[str, str]] = []
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.reached: dict[int, asyncio.Event] = {}

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> WriteOutcome:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.in_flight in self.reached:
            self.reached[self.in_flight].set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            self.patches.append((plural, name))
            return WriteOutcome.WRITTEN
        finally:
            self.in_flight -= 1

    async def post_event(self, ref: Any, *, type_: str, reason: str, message: str) -> None:
        return None

    async def list_objects(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        if plural == "generationshards":
            return [
                {
                    "metadata": {
                        "name": f"s{i}",
                        "namespace": NS,
                        "uid": f"u{i}",
                        "generation": 1,
                        "labels": {"fleet": "a"},
                    },
                    "spec": {
                        "endpoint": f"http://s{i}.example:8000",
                        "model": "m",
                        "probe": PROBE,
                        "drain": f"s{i}" in self.drained,
                    },
                }
                for i in range(self.shards)
            ]
        if plural == "rolloutfleets":
            return [
                {
                    "metadata": {"name": "a", "namespace": NS, "uid": "fa", "generation": 1},
                    "spec": {"shardSelector": {"matchLabels": {"fleet": "a"}}},
                }
            ]
        return []


class Prober:
    def __init__(self) -> None:
        self.down: set[str] = set()

    async def probe(self, endpoint: str, settings: ProbeSettings, *, expected_model: str | None = None) -> ProbeResult:
        if endpoint in self.down:
            return ProbeResult.failure(ProbeReason.CONNECT, "connection refused")
        return ProbeResult.success(latency_seconds=0.001)


def engine_for(api: FakeApi, prober: Prober) -> FleetEngine:
    settings = OperatorSettings(
        status_heartbeat_seconds=HEARTBEAT, fleet_coalesce_seconds=0.5, leader_election=False, http_port=0
    )
    return FleetEngine(settings, api, prober, wall_clock=lambda: 1_700_000_000.0)


async def test_a_fleet_change_is_written_before_a_wave_of_target_heartbeats() -> None:
    api, prober = FakeApi(40), Prober()
    engine = engine_for(api, prober)
    await engine.prime()
    await engine.probe_now()
    now = asyncio.get_running_loop().time()
    await engine.write_pass(now + 1)  # everything Healthy and published
    prober.down.add("http://s7.example:8000")
    await engine.probe_now()  # s7 -> Unhealthy (failureThreshold 1): the fleet's healthy set changes
    api.patches.clear()
    await engine.write_pass(now + 1 + HEARTBEAT)  # ...in the same pass as every target's heartbeat
    order = [name for plural, name in api.patches]
    assert ("rolloutfleets", "a") in api.patches
    assert order.index("s7") < order.index("a"), "the transition is written first"
    heartbeats = [i for i, (plural, name) in enumerate(api.patches) if plural == "generationshards" and name != "s7"]
    s0 = engine._targets.records.targets[next(k for k in engine._targets.records.targets if k.name == "s0")]
    assert len(heartbeats) == 39, f"heartbeats at {now + 1 + HEARTBEAT!r}: s0 write state {s0.write!r}"
    assert order.index("a") < min(heartbeats), "the fleet must not wait behind 39 heartbeat PATCHes"


async def test_the_patches_of_one_sweep_overlap_up_to_a_bound() -> None:
    """Invariant: a sweep of many writes keeps several PATCHes in flight, never more than the writer's bound."""
    api, prober = FakeApi(40), Prober()
    engine = engine_for(api, prober)
    await engine.prime()
    await engine.probe_now()  # 40 Pending -> Healthy transitions to write
    api.gate = asyncio.Event()
    api.reached[16] = asyncio.Event()
    writing = asyncio.create_task(engine.write_pass(asyncio.get_running_loop().time() + 1))
    await within(api.reached[16].wait(), lambda: f"16 concurrent status writes; {api.in_flight} in flight", 30)
    for _ in range(10):
        await asyncio.sleep(0)  # let any further writer coroutine start, if the bound allowed it
    assert api.in_flight == 16
    api.gate.set()
    await writing
    assert api.max_in_flight == 16
    assert sum(plural == "generationshards" for plural, _ in api.patches) == 40


async def test_priming_many_shards_sets_the_probe_targets_once_and_keeps_drain_flags() -> None:
    api, prober = FakeApi(300, drained=frozenset({"s5"})), Prober()
    engine = engine_for(api, prober)
    monitor = engine._targets.monitor
    calls = 0
    original = monitor.set_targets

    def counting(*args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        original(*args, **kwargs)

    monitor.set_targets = counting  # type: ignore[method-assign]
    await engine.prime()
    assert calls == 1, f"priming 300 shards rebuilt the probe list {calls} times"
    assert len(monitor.targets) == 300
    await engine.probe_now()
    assert engine.phase("GenerationShard", NS, "s5") is HealthPhase.DRAINING
    assert engine.phase("GenerationShard", NS, "s6") is HealthPhase.HEALTHY
