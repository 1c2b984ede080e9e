"""Per-target timers under looptime: a blackholed target delays nobody, the concurrency limit is FIFO, abandoned
probes are never recorded, and completed requests count as evidence of life."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from rollout_runtime.health import HealthMonitor, HealthPhase, ProbeReason, ProbeResult, ProbeSettings, ProbeTarget

FAST = ProbeSettings(period_seconds=1, timeout_seconds=0.5, failure_threshold=3, success_threshold=1)
BLACKHOLE = ProbeSettings(period_seconds=3600, timeout_seconds=3599, failure_threshold=3, success_threshold=1)


class TimedProber:
    """Each endpoint answers after ``delay[endpoint]`` seconds (a timeout when that reaches the probe's timeout, as
    HttpProber would report it); ``down`` endpoints refuse at once. Records when each probe started."""

    def __init__(self, delay: dict[str, float] | None = None) -> None:
        self.delay = delay or {}
        self.down: set[str] = set()
        self.starts: list[tuple[str, float]] = []
        self.running = 0
        self.most_running = 0

    async def probe(self, endpoint: str, settings: ProbeSettings, *, expected_model: str | None = None) -> ProbeResult:
        loop = asyncio.get_running_loop()
        self.starts.append((endpoint, loop.time()))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            if endpoint in self.down:
                return ProbeResult.failure(ProbeReason.CONNECT, "connection refused")
            delay = self.delay.get(endpoint, 0.0)
            await asyncio.sleep(min(delay, settings.timeout_seconds))
            if delay >= settings.timeout_seconds:
                return ProbeResult.failure(ProbeReason.TIMEOUT, f"no answer within {settings.timeout_seconds:g} s")
            return ProbeResult.success(at=loop.time())
        finally:
            self.running -= 1

    def started(self, endpoint: str) -> list[float]:
        return [at for e, at in self.starts if e == endpoint]


async def run_until(rounds: AsyncIterator[object], until: float) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        await anext(rounds)


@pytest.mark.looptime
async def test_a_blackholed_target_does_not_delay_another_targets_probes() -> None:
    prober = TimedProber({"hole": 10_000.0})
    monitor = HealthMonitor([ProbeTarget("hole", "hole", BLACKHOLE), ProbeTarget("a", "a", FAST)], prober)
    start = asyncio.get_running_loop().time()
    rounds = monitor.rounds()
    await run_until(rounds, start + 10)
    prober.down.add("a")  # killed while the blackhole's first probe is still pending
    killed_at = asyncio.get_running_loop().time()
    while monitor.states["a"].phase is not HealthPhase.UNHEALTHY:
        await anext(rounds)
    detected = asyncio.get_running_loop().time() - killed_at
    await rounds.aclose()
    assert prober.started("hole") == [start], "the blackhole's one probe was still pending throughout"
    starts = prober.started("a")
    assert [round(b - a, 6) for a, b in itertools.pairwise(starts)] == [1.0] * (len(starts) - 1)
    assert detected <= FAST.failure_threshold * FAST.period_seconds + FAST.timeout_seconds


@pytest.mark.looptime
async def test_the_concurrency_limit_serves_probes_in_due_order() -> None:
    prober = TimedProber({name: 0.2 for name in "abcd"})
    settings = ProbeSettings(period_seconds=1, timeout_seconds=0.5)
    monitor = HealthMonitor([ProbeTarget(n, n, settings) for n in "abcd"], prober, max_concurrency=2)
    start = asyncio.get_running_loop().time()
    rounds = monitor.rounds()
    await run_until(rounds, start + 3)
    await rounds.aclose()
    assert prober.most_running == 2
    first = [(e, round(at - start, 6)) for e, at in prober.starts[:4]]
    assert first == [("a", 0.0), ("b", 0.0), ("c", 0.2), ("d", 0.2)]
    # Each target's period runs from when its probe got a slot, so the queue does not grow: a, b stay at whole
    # seconds, c, d at 0.2 past them.
    assert [round(at - start, 6) for at in prober.started("c")][:3] == [0.2, 1.2, 2.2]


@pytest.mark.looptime
async def test_a_removed_targets_probe_in_flight_is_abandoned_and_never_recorded() -> None:
    prober = TimedProber({"slow": 5.0})
    slow = ProbeSettings(period_seconds=10, timeout_seconds=9)
    monitor = HealthMonitor([ProbeTarget("slow", "slow", slow), ProbeTarget("a", "a", FAST)], prober)
    rounds = monitor.rounds()
    first = await anext(rounds)
    assert set(first.results) == {"a"}
    monitor.set_targets([ProbeTarget("a", "a", FAST)])
    seen: set[str] = set()
    start = asyncio.get_running_loop().time()
    while asyncio.get_running_loop().time() < start + 8:
        seen |= set((await anext(rounds)).results)
    await rounds.aclose()
    assert seen == {"a"}
    assert "slow" not in monitor.states


@pytest.mark.looptime
async def test_a_new_endpoint_is_probed_at_once_and_the_old_probe_is_abandoned() -> None:
    prober = TimedProber({"old": 5.0})
    settings = ProbeSettings(period_seconds=10, timeout_seconds=9, success_threshold=1)
    monitor = HealthMonitor([ProbeTarget("s", "old", settings)], prober)
    rounds = monitor.rounds()
    waiting = asyncio.ensure_future(anext(rounds))
    await asyncio.sleep(1)
    monitor.set_targets([ProbeTarget("s", "new", settings)])
    probe_round = await waiting
    assert asyncio.get_running_loop().time() == pytest.approx(prober.started("old")[0] + 1)
    assert probe_round.results["s"].ok
    assert prober.started("new") == [prober.started("old")[0] + 1]
    await rounds.aclose()


@pytest.mark.looptime
async def test_closing_the_rounds_abandons_the_probes_in_flight() -> None:
    prober = TimedProber({"hole": 10_000.0})
    monitor = HealthMonitor([ProbeTarget("hole", "hole", BLACKHOLE), ProbeTarget("a", "a", FAST)], prober)
    rounds = monitor.rounds()
    await anext(rounds)
    assert prober.running == 1
    await rounds.aclose()
    assert prober.running == 0
    # A new iteration probes again at once: the abandoned probe left nothing in flight behind.
    rounds = monitor.rounds()
    await anext(rounds)
    await rounds.aclose()
    assert len(prober.started("a")) == 2


@pytest.mark.looptime
async def test_a_busy_target_whose_probes_time_out_stays_serving_while_requests_complete() -> None:
    prober = TimedProber({"busy": 10.0})
    settings = ProbeSettings(period_seconds=5, timeout_seconds=2, failure_threshold=3, success_threshold=1)
    monitor = HealthMonitor([ProbeTarget("busy", "busy", settings)], prober)
    rounds = monitor.rounds()
    probe_round = await anext(rounds)
    assert probe_round.results["busy"].reason is ProbeReason.TIMEOUT
    assert monitor.states["busy"].phase is HealthPhase.PENDING
    prober.delay["busy"] = 0.0
    await anext(rounds)  # due 5 s after the first start
    await anext(rounds)
    assert monitor.states["busy"].phase is HealthPhase.HEALTHY
    prober.delay["busy"] = 10.0
    phases = []
    for _ in range(6):
        monitor.record_request_success("busy")  # the dispatcher's completions, between probes
        await anext(rounds)
        phases.append(monitor.states["busy"].phase)
    assert set(phases) == {HealthPhase.SUSPECT}
    for _ in range(3):  # the requests stop too: now the timeouts are decisive
        await anext(rounds)
    await rounds.aclose()
    assert monitor.states["busy"].phase is HealthPhase.UNHEALTHY
    monitor.record_request_success("gone")  # unknown names are ignored
