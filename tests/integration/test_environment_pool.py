"""EnvironmentPool: episodes across real sim-env processes that are killed mid-episode (SIGKILL), with the
dispatcher's selection, ejection and redispatch; continuation from a checkpoint on another server, or a restart
from the input for a restart-only episode, as seed 004 describes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollout_runtime.dispatch import AttemptEnded, Completed, DispatchEvent, DispatchPolicy
from rollout_runtime.dispatch.affinity import rendezvous_score
from rollout_runtime.environment import EnvironmentClient
from rollout_runtime.environment.pool import EnvironmentPool
from rollout_runtime.health import ProbeSettings
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim.env_process import SimEnvProcess, spawn_env_server
from rollout_runtime.sim.environments import MultiStepResponse
from rollout_runtime.sim.process import until
from support.deadlines import within
from support.environment import killed_at_exit

PROBES = ProbeSettings(period_seconds=0.3, timeout_seconds=0.25, failure_threshold=2, success_threshold=1)
POLICY = DispatchPolicy(backoff_initial_seconds=0.05, backoff_max_seconds=0.5, healthy_wait_seconds=30)


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[list[SimEnvProcess]]:
    """Two multistep servers sharing one checkpoint store (as two pods on one shared volume)."""
    async with killed_at_exit() as started:
        for name in ("env-a", "env-b"):
            started.append(
                await spawn_env_server(
                    "multistep", checkpoint_dir=tmp_path / "checkpoints", log_path=tmp_path / f"{name}.log"
                )
            )
        yield started


def _shards(servers: list[SimEnvProcess]) -> list[Shard]:
    return [Shard(name=name, endpoint=s.url) for name, s in zip(("env-a", "env-b"), servers, strict=True)]


def _pinned_to(name: str, prefix: str) -> str:
    """An episode id whose own server (by rendezvous) is ``name``."""
    return next(
        f"{prefix}-{i}"
        for i in range(1000)
        if max(("env-a", "env-b"), key=lambda n: rendezvous_score(f"{prefix}-{i}", n)) == name
    )


async def test_episodes_complete_when_a_server_is_killed_and_stay_on_their_server_otherwise(
    servers: list[SimEnvProcess],
) -> None:
    events: list[DispatchEvent] = []
    episodes = [{"episode_id": f"ep-{i}", "values": [i, 1, 2, 3], "step_delay_seconds": 0.1} for i in range(10)]
    source = LocalShardSource(_shards(servers), PROBES)
    async with EnvironmentPool(source, POLICY, observer=events.append) as pool, EnvironmentClient(servers[0].url) as a:
        await until(lambda: len(pool.dispatcher.routable) == 2, timeout_seconds=30, what="both servers routable")
        run = pool.run(episodes, MultiStepResponse)
        collected: list[object] = []

        async def consume() -> None:
            async for outcome in run:
                collected.append(outcome)

        consuming = asyncio.create_task(consume())

        async def a_is_busy() -> bool:
            return bool((await a.health())["episodes_in_flight"])

        await until(a_is_busy, timeout_seconds=30, what="episodes in flight on env-a")
        await servers[0].kill()
        await within(consuming, "every episode after env-a's death")

    completed = [o for o in collected if isinstance(o, Completed)]
    assert len(completed) == len(episodes)
    assert all(o.result.reward == 1.0 for o in completed)
    moved = [o for o in completed if o.attempts > 1]
    assert moved  # the kill really hit episodes in flight
    assert all(o.shard == "env-b" for o in moved)
    # every first attempt went to the episode's own server
    firsts: dict[object, str] = {}
    for event in events:
        if isinstance(event, AttemptEnded) and event.shard is not None:
            firsts.setdefault(event.prompt_id, event.shard)
    for episode_id, shard in firsts.items():
        assert shard == max(("env-a", "env-b"), key=lambda n: rendezvous_score(str(episode_id), n))
    failed_on_a = [e for e in events if isinstance(e, AttemptEnded) and e.shard == "env-a" and e.outcome != "success"]
    assert len(failed_on_a) == len(moved)  # one failed (or evicted) attempt per moved episode, none afterwards


@pytest.mark.parametrize("restart_only", [False, True], ids=["checkpointed", "restart-only"])
async def test_an_episode_whose_server_dies_continues_from_its_checkpoint_elsewhere_or_restarts(
    servers: list[SimEnvProcess], restart_only: bool
) -> None:
    episode_id = _pinned_to("env-a", "ckpt")
    request = {"episode_id": episode_id, "values": [1, 2, 3, 4, 5], "step_delay_seconds": 0.2,
               "restart_only": restart_only}  # fmt: skip
    source = LocalShardSource(_shards(servers), PROBES)
    async with EnvironmentPool(source, POLICY) as pool, EnvironmentClient(servers[0].url) as a:
        await until(lambda: len(pool.dispatcher.routable) == 2, timeout_seconds=30, what="both servers routable")
        running = asyncio.create_task(pool.run_episode(request, MultiStepResponse))

        async def in_flight_on_a() -> bool:
            return bool((await a.health())["episodes_in_flight"])

        await until(in_flight_on_a, timeout_seconds=30, what="the episode in flight on env-a")
        # Parks and exports the episode. One that has not finished its first step yet is not exported (a restore
        # would start it over): resume and checkpoint again until it has a step to continue from.
        manifest = await within(a.open_checkpoint(), "env-a's checkpoint")
        for _ in range(5):  # each checkpoint parks the episode at its next step boundary: one resume is enough
            if restart_only or episode_id in manifest.episodes:
                break
            await a.resume_checkpoint()
            manifest = await within(a.open_checkpoint(), "env-a's checkpoint after its first step")
        await servers[0].kill()
        reply = await within(running, "the episode on env-b")

    assert reply.reward == 1.0
    assert reply.totals == [1, 3, 6, 10, 15]
    if restart_only:
        assert episode_id not in manifest.episodes  # never exported: it starts over from its input
        assert reply.continued_from_step is None
        assert reply.steps_run == [0, 1, 2, 3, 4]
    else:
        recorded = manifest.episodes[episode_id].steps_recorded
        assert recorded >= 1
        assert reply.continued_from_step is not None
        assert reply.continued_from_step >= 1
        assert reply.steps_run == list(range(reply.continued_from_step, 5))
