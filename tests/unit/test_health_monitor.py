"""The probe loop under looptime: periods, rounds, transitions, drains and target changes, with a scripted prober."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from rollout_runtime.health import (
    HealthMonitor,
    HealthPhase,
    HealthState,
    ProbeReason,
    ProbeResult,
    ProbeSettings,
    ProbeTarget,
    Transition,
)

SETTINGS = ProbeSettings(period_seconds=5, timeout_seconds=2, failure_threshold=3, success_threshold=2)


class ScriptedProber:
    """Answers each endpoint from a script of '+'/'-' (the last entry repeats); records when it was asked."""

    def __init__(self, scripts: dict[str, str]) -> None:
        self.scripts = scripts
        self.calls: list[tuple[str, float]] = []

    async def probe(self, endpoint: str, settings: ProbeSettings, *, expected_model: str | None = None) -> ProbeResult:
        loop = asyncio.get_running_loop()
        index = sum(1 for e, _ in self.calls if e == endpoint)
        self.calls.append((endpoint, loop.time()))
        script = self.scripts[endpoint]
        ok = script[min(index, len(script) - 1)] == "+"
        if ok:
            return ProbeResult.success(at=1000.0 + loop.time())
        return ProbeResult.failure(ProbeReason.CONNECT, f"{endpoint} refused")


def targets(*names: str) -> Iterator[ProbeTarget]:
    return (ProbeTarget(name, name, SETTINGS) for name in names)


@pytest.mark.looptime
async def test_each_target_is_probed_once_per_period() -> None:
    prober = ScriptedProber({"a": "+", "b": "+"})
    monitor = HealthMonitor(targets("a", "b"), prober)
    start = asyncio.get_running_loop().time()
    rounds = monitor.rounds()
    for _ in range(3):
        probe_round = await anext(rounds)
        assert set(probe_round.results) == {"a", "b"}
    await rounds.aclose()
    times = sorted({t - start for _, t in prober.calls})
    assert times == [0, 5, 10]


@pytest.mark.looptime
async def test_rounds_report_transitions_and_the_callback_hears_them() -> None:
    heard: list[tuple[str, Transition]] = []
    monitor = HealthMonitor(
        targets("a"), ScriptedProber({"a": "++---"}), on_transition=lambda n, t, r: heard.append((n, t))
    )
    rounds = monitor.rounds()
    phases = []
    for _ in range(5):
        await anext(rounds)
        phases.append(monitor.states["a"].phase)
    await rounds.aclose()
    assert phases == [HealthPhase.PENDING, HealthPhase.HEALTHY, HealthPhase.SUSPECT, HealthPhase.SUSPECT,
                      HealthPhase.UNHEALTHY]  # fmt: skip
    assert [(t.from_phase, t.to_phase) for _, t in heard] == [
        (HealthPhase.PENDING, HealthPhase.HEALTHY),
        (HealthPhase.HEALTHY, HealthPhase.SUSPECT),
        (HealthPhase.SUSPECT, HealthPhase.UNHEALTHY),
    ]


@pytest.mark.looptime
async def test_last_ok_at_tracks_the_latest_successful_probe_only() -> None:
    monitor = HealthMonitor(targets("a", "b"), ScriptedProber({"a": "++-", "b": "-"}))
    await monitor.probe_round()
    second = await monitor.probe_round()
    await monitor.probe_round()
    assert set(monitor.last_ok_at) == {"a"}
    assert monitor.last_ok_at["a"] == second.results["a"].at
    last = monitor.states["a"].last_result
    assert last is not None
    assert not last.ok


@pytest.mark.looptime
async def test_async_and_failing_callbacks_do_not_stop_the_loop() -> None:
    heard: list[str] = []

    async def callback(name: str, transition: Transition, result: ProbeResult | None) -> None:
        heard.append(name)
        raise RuntimeError("observer bug")

    monitor = HealthMonitor(targets("a"), ScriptedProber({"a": "+"}), on_transition=callback)
    await monitor.probe_round()
    probe_round = await monitor.probe_round()
    assert heard == ["a"]
    assert probe_round.transitions[0][1].to_phase is HealthPhase.HEALTHY


@pytest.mark.looptime
async def test_drain_changes_are_reported_at_once_as_a_round_without_results() -> None:
    monitor = HealthMonitor(targets("a"), ScriptedProber({"a": "+"}))
    rounds = monitor.rounds()
    await anext(rounds)
    start = asyncio.get_running_loop().time()
    waiting = asyncio.ensure_future(anext(rounds))
    await asyncio.sleep(1)  # looptime: advances the fake clock; the next probe is due at +5 s
    assert not waiting.done()
    await monitor.set_draining("a", True)
    drained = await waiting
    await rounds.aclose()
    assert drained.results == {}
    assert drained.transitions[0][1].to_phase is HealthPhase.DRAINING
    assert asyncio.get_running_loop().time() - start == 1


@pytest.mark.looptime
async def test_replacing_targets_keeps_surviving_state_and_probes_newcomers_at_once() -> None:
    prober = ScriptedProber({"a": "+", "b": "+", "c": "+"})
    monitor = HealthMonitor(targets("a", "b"), prober)
    await monitor.probe_round()
    await monitor.probe_round()
    monitor.set_targets(targets("a", "c"))
    assert set(monitor.states) == {"a", "c"}
    assert monitor.states["a"].phase is HealthPhase.HEALTHY
    assert monitor.states["c"].phase is HealthPhase.PENDING
    rounds = monitor.rounds()
    first = await anext(rounds)
    await rounds.aclose()
    assert set(first.results) == {"a", "c"}


def test_max_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        HealthMonitor([], ScriptedProber({}), max_concurrency=0)


async def test_new_targets_can_start_from_a_restored_state() -> None:
    restored = HealthState.restore(SETTINGS, HealthPhase.HEALTHY, consecutive_successes=2)
    monitor = HealthMonitor([], ScriptedProber({"a": "-"}))
    monitor.set_targets(targets("a"), initial_states={"a": restored, "unknown": HealthState()})
    assert set(monitor.states) == {"a"}
    assert monitor.states["a"].serving
    await monitor.probe_round()
    assert monitor.states["a"].phase is HealthPhase.SUSPECT  # resumed, not restarted from Pending


@pytest.mark.looptime
@pytest.mark.parametrize("period", [0.1, 0.3, 0.7, 1.1, 2.9])
async def test_fractional_periods_never_spin_the_loop(period: float) -> None:
    """Regression: a target due a sub-resolution moment from now was neither due nor waitable, so the loop spun
    at a frozen loop time. Every round must now advance the clock by one period."""
    settings = ProbeSettings(period_seconds=period, timeout_seconds=period / 2)
    prober = ScriptedProber({"a": "+"})
    monitor = HealthMonitor([ProbeTarget("a", "a", settings)], prober)
    rounds = monitor.rounds()
    for _ in range(200):
        await anext(rounds)
    await rounds.aclose()
    assert len(prober.calls) == 200
    gaps = [b - a for (_, a), (_, b) in zip(prober.calls, prober.calls[1:], strict=False)]
    assert all(gap == pytest.approx(period, abs=1e-5) for gap in gaps)
