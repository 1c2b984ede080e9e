"""The chaos fault schedule and injector: reproducible schedules, and faults that really happen to real processes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollout_runtime.environment import EnvironmentClient
from rollout_runtime.failures import GymTransportError
from rollout_runtime.sim import SimFleet
from rollout_runtime.sim.chaos import (
    FLEET_TARGET,
    GENERATED_KINDS,
    Fault,
    FaultInjector,
    FaultKind,
    FaultSchedule,
    SimEnvTarget,
)
from rollout_runtime.sim.environments import MultiStepRequest, MultiStepResponse
from rollout_runtime.sim.process import until

NAMES = ["shard-0", "shard-1", "shard-2"]


def test_the_same_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    first = FaultSchedule.generate(7, NAMES)
    assert FaultSchedule.generate(7, NAMES) == first
    assert FaultSchedule.generate(8, NAMES) != first


def test_a_generated_schedule_has_every_kind_in_order_within_bounds() -> None:
    schedule = FaultSchedule.generate(3, NAMES, per_kind=2, start=0.1, end=0.7)
    assert schedule.kinds() == {kind.value: 2 for kind in GENERATED_KINDS}
    starts = [fault.at_progress for fault in schedule.faults]
    assert starts == sorted(starts)
    assert all(0.1 <= start <= 0.7 for start in starts)
    for fault in schedule.faults:
        if fault.kind is FaultKind.ALL_SHARDS_DOWN:
            assert fault.target == FLEET_TARGET
        elif fault.kind is FaultKind.ENV_CRASH:
            assert fault.target == "env"
        else:
            assert fault.target in NAMES
        if fault.kind is FaultKind.ERROR_BURST_5XX:
            assert fault.status is not None
            assert 500 <= fault.status <= 599
            assert fault.count > 0


def test_without_an_environment_no_env_crash_is_drawn() -> None:
    assert "env_crash" not in FaultSchedule.generate(1, NAMES, environment=None).kinds()


def test_a_fault_on_an_unknown_target_is_refused_up_front() -> None:
    fleet = SimFleet(2)
    bad = FaultSchedule.of([Fault(kind=FaultKind.SHARD_KILL, target="shard-9", at_progress=0.1)])
    with pytest.raises(ValueError, match="shard-9"):
        FaultInjector(fleet, bad)
    crash = FaultSchedule.of([Fault(kind=FaultKind.ENV_CRASH, target="env", at_progress=0.1)])
    with pytest.raises(ValueError, match="no environment target"):
        FaultInjector(fleet, crash)


async def test_faults_fire_when_progress_reaches_them_and_are_undone_on_close() -> None:
    schedule = FaultSchedule.of(
        [
            Fault(kind=FaultKind.SHARD_KILL, target="shard-0", at_progress=0.2, hold_seconds=3600),
            Fault(kind=FaultKind.SHARD_HANG, target="shard-1", at_progress=0.2, hold_seconds=3600),
            Fault(
                kind=FaultKind.ERROR_BURST_5XX,
                target="shard-2",
                at_progress=0.5,
                count=2,
                status=502,
                hold_seconds=3600,
            ),
        ]
    )
    async with SimFleet(3) as fleet, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        injector = FaultInjector(fleet, schedule)
        killed_pid = fleet.pid("shard-0")
        try:
            injector.advance(0.1)
            assert injector.pending == 3
            assert injector.active == 0

            injector.advance(0.3)
            assert injector.pending == 1
            await injector.until_applied(2)
            assert not fleet.alive("shard-0")
            assert fleet.members()["shard-1"].stopped

            injector.advance(0.5)
            await injector.until_applied(3)
            assert (await _faults(session, fleet, "shard-2"))["fail_next"] == 2
            url = f"{fleet.shard('shard-2').endpoint}/v1/completions"
            async with session.post(url, json={"prompt": "1 + 1"}) as response:
                assert response.status == 502
        finally:
            await injector.close()  # cancels the holds: everything is undone
        assert fleet.alive("shard-0")
        assert fleet.pid("shard-0") != killed_pid
        assert not fleet.members()["shard-1"].stopped
        assert (await _faults(session, fleet, "shard-2"))["fail_next"] == 0
        async with session.get(f"{fleet.shard('shard-1').endpoint}/health") as response:
            assert response.status == 200
        assert [record.fault.kind for record in injector.injected] == [
            FaultKind.SHARD_KILL,
            FaultKind.SHARD_HANG,
            FaultKind.ERROR_BURST_5XX,
        ]
        assert all(record.ended is not None for record in injector.injected)
        assert injector.injected[0].detail["exit_status"] == -9
        assert not injector.errors


async def test_a_sigterm_lets_the_request_in_flight_finish_and_the_restart_comes_back_on_its_port() -> None:
    schedule = FaultSchedule.of([Fault(kind=FaultKind.SHARD_TERMINATE, target="shard-0", at_progress=0.5)])
    async with SimFleet(1) as fleet, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        await fleet.set_faults("shard-0", slow_seconds=0.5)
        injector = FaultInjector(fleet, schedule)
        endpoint, pid = fleet.shard("shard-0").endpoint, fleet.pid("shard-0")

        async def generate() -> tuple[int, dict[str, object]]:
            async with session.post(f"{endpoint}/v1/completions", json={"prompt": "What is 2 + 3?"}) as response:
                return response.status, await response.json()

        in_flight = asyncio.create_task(generate())

        async def started() -> bool:
            return (await fleet.stats("shard-0")).get("generation_requests", 0) == 1

        await until(started, timeout_seconds=10, what="the request to reach the shard")
        try:
            injector.advance(0.5)
            status, body = await in_flight  # answered during the drain, after the SIGTERM
            await injector.until_applied(1)  # the shard has exited
        finally:
            await injector.close()
        assert status == 200
        assert body["choices"][0]["text"] == "5"  # type: ignore[index]
        record = injector.injected[0]
        assert record.detail["exit_status"] == 0  # it exited by itself, not by the SIGKILL after the grace
        [drained] = record.detail["final_stats"]
        assert (drained["generation_requests"], drained["completions"]) == (1, 1)
        assert fleet.alive("shard-0")
        assert fleet.pid("shard-0") != pid
        assert fleet.shard("shard-0").endpoint == endpoint


@pytest.mark.parametrize("body", ["empty", "no_choices"])
async def test_a_gray_shard_answers_200_with_a_body_that_is_not_a_completion_while_its_health_is_200(body: str) -> None:
    gray = Fault(kind=FaultKind.GRAY_200, target="shard-0", at_progress=0.5, hold_seconds=3600, body=body)
    capped = Fault(kind=FaultKind.CONCURRENCY_CAP, target="shard-1", at_progress=0.5, hold_seconds=3600, count=1)
    async with SimFleet(2) as fleet, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        injector = FaultInjector(fleet, FaultSchedule.of([gray, capped]))
        try:
            injector.advance(0.5)
            await injector.until_applied(2)
            gray_url = fleet.shard("shard-0").endpoint
            async with session.post(f"{gray_url}/v1/completions", json={"prompt": "What is 2 + 3?"}) as response:
                assert response.status == 200
                raw = await response.read()
            async with session.get(f"{gray_url}/health") as response:
                assert response.status == 200
            assert (await _faults(session, fleet, "shard-1"))["max_concurrent"] == 1
        finally:
            await injector.close()
        assert raw == b"" if body == "empty" else b'"choices": []' in raw
        assert (await fleet.stats("shard-0"))[f"not_a_completion_{body}"] == 1
        assert (await _faults(session, fleet, "shard-0"))["not_a_completion_rate"] == 0
        assert (await _faults(session, fleet, "shard-1"))["max_concurrent"] is None


async def _faults(session: aiohttp.ClientSession, fleet: SimFleet, name: str) -> dict[str, object]:
    async with session.get(f"{fleet.shard(name).endpoint}/admin/faults") as response:
        result: dict[str, object] = await response.json()
        return result


async def test_env_crash_checkpoints_parked_episodes_and_the_restart_continues_them(tmp_path: Path) -> None:
    schedule = FaultSchedule.of([Fault(kind=FaultKind.ENV_CRASH, target="env", at_progress=0.0)])

    async with SimFleet(0) as fleet, SimEnvTarget("multistep", checkpoint_dir=tmp_path / "ckpt") as env:
        port = env.port
        request = MultiStepRequest(episode_id="crash-me", values=[1, 2, 3, 4, 5, 6], step_delay_seconds=0.3)
        injector = FaultInjector(fleet, schedule, environments={"env": env})
        await _crash_mid_episode(env, injector, request, progress=0.0)
        (record,) = injector.injected
        assert record.detail["checkpointed_episodes"] == ["crash-me"]
        assert env.port == port
        assert env.restarts == 1
        async with EnvironmentClient(env.url, timeout_seconds=30) as client:
            reply = await client.run_episode(request, MultiStepResponse)
        assert reply.reward == 1.0
        assert reply.totals == [1, 3, 6, 10, 15, 21]
        assert reply.continued_from_step is not None
        assert reply.continued_from_step > 0


class _CountingEnvTarget(SimEnvTarget):
    """A real sim-env target that says when the injector released an empty checkpoint."""

    def __init__(self, kind: str, *, checkpoint_dir: Path) -> None:
        super().__init__(kind, checkpoint_dir=checkpoint_dir)
        self.released = asyncio.Event()

    async def resume(self) -> None:
        await super().resume()
        self.released.set()


async def test_env_crash_on_an_idle_server_waits_for_an_episode_instead_of_crashing_nothing(tmp_path: Path) -> None:
    schedule = FaultSchedule.of([Fault(kind=FaultKind.ENV_CRASH, target="env", at_progress=0.0)])

    async with SimFleet(0) as fleet, _CountingEnvTarget("multistep", checkpoint_dir=tmp_path / "ckpt") as env:
        injector = FaultInjector(fleet, schedule, environments={"env": env})
        injector.advance(0.0)
        released = asyncio.create_task(env.released.wait())
        crashed = asyncio.create_task(injector.until_applied(1))
        _, pending = await asyncio.wait({released, crashed}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        assert released.done(), "the injector crashed an environment with no episode in flight"
        assert env.restarts == 0
        request = MultiStepRequest(episode_id="late", values=[1, 2, 3, 4, 5, 6], step_delay_seconds=0.3)
        await _crash_mid_episode(env, injector, request, progress=0.5)
        (record,) = injector.injected
        assert record.detail["checkpointed_episodes"] == ["late"]
        assert env.restarts == 1
        assert not injector.errors


async def _crash_mid_episode(
    env: SimEnvTarget, injector: FaultInjector, request: MultiStepRequest, *, progress: float
) -> None:
    """Run ``request`` on ``env``, and once it is in flight advance ``injector`` to ``progress``: its crash ends the
    episode with a transport error. (The checkpoint waits for the episode's step to record, then parks it.)"""
    async with EnvironmentClient(env.url, timeout_seconds=30) as client:
        episode = asyncio.create_task(client.run_episode(request, MultiStepResponse))
        await _until_in_flight(env.url)
        injector.advance(progress)
        await injector.wait()
        with pytest.raises(GymTransportError):
            await episode


async def _until_in_flight(url: str) -> None:
    """The server runs the episode (asked over HTTP: the server is another process, there is no event to await)."""
    async with EnvironmentClient(url) as client:
        for _ in range(200):
            if (await client.health())["episodes_in_flight"] >= 1:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the episode never started")


class SlowRestartFleet:
    """A ShardFleet whose restart takes as long as the test says (a real vLLM server takes a minute)."""

    model = "m"
    names = ["s"]

    def __init__(self) -> None:
        self.restarting = asyncio.Event()
        self.may_finish = asyncio.Event()
        self.up = True

    def alive(self, name: str) -> bool:
        return self.up

    async def kill(self, name: str) -> int | None:
        self.up = False
        return -9

    def hang(self, name: str) -> None: ...

    def resume(self, name: str) -> None: ...

    async def restart(self, name: str) -> Any:
        self.restarting.set()
        await self.may_finish.wait()
        self.up = True

    async def set_faults(self, name: str, **fields: Any) -> Any: ...


async def test_close_returns_only_once_a_cancelled_kill_has_restarted_its_shard() -> None:
    """A run that ends while a killed shard is coming back cancels the fault; the restart must still finish before
    close() returns, or whoever settles the fleet next (the demo's refitter) sees a shard that is neither up nor
    Stale, and the fleet is stopped with the restart half done."""
    fleet = SlowRestartFleet()
    kill = Fault(kind=FaultKind.SHARD_KILL, target="s", at_progress=0.1, until_progress=0.5)
    injector = FaultInjector(fleet, FaultSchedule.of([kill]))
    injector.advance(0.1)
    await injector.until_applied(1)
    injector.advance(0.5)  # the hold ends: the restart begins
    await asyncio.wait_for(fleet.restarting.wait(), 10)
    closing = asyncio.create_task(injector.close())
    await until(lambda: injector.injected[0].ended is not None, timeout_seconds=10, what="the fault cancelled")
    assert not closing.done(), "close() must wait for the restart it cancelled the fault around"
    fleet.may_finish.set()
    await asyncio.wait_for(closing, 10)
    assert fleet.up
