"""LocalShardSource against real sim shard subprocesses: shards join, leave and return as their probes say."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from rollout_runtime.health import HealthPhase, ProbeReason, ProbeSettings
from rollout_runtime.shards import HealthySet, LocalShardSource, Shard, ShardSource
from rollout_runtime.sim import SimFaults, SimFleet
from support.deadlines import deadline

FAST = ProbeSettings(period_seconds=0.5, timeout_seconds=0.4, failure_threshold=2, success_threshold=2)
GUARD_SECONDS = 60  # a hang guard, not a timing assertion


async def until(
    snapshots: AsyncIterator[HealthySet],
    condition: Callable[[HealthySet], bool],
    seen: list[HealthySet] | None = None,
) -> HealthySet:
    """Consume snapshots until one satisfies ``condition``; record every snapshot in ``seen``."""
    recorded = seen if seen is not None else []

    def waited_for() -> str:
        return f"a snapshot satisfying the condition; the last was {recorded[-1:]}"

    async with deadline(waited_for, GUARD_SECONDS):
        async for snapshot in snapshots:
            recorded.append(snapshot)
            if condition(snapshot):
                return snapshot
    raise AssertionError("the snapshot stream ended")


async def test_local_source_is_a_shard_source() -> None:
    assert isinstance(LocalShardSource([]), ShardSource)


async def test_shards_join_the_set_only_after_success_threshold_probe_rounds() -> None:
    async with SimFleet(2) as fleet:
        source = LocalShardSource(fleet.shards, FAST.model_copy(update={"check_model": True}))
        seen: list[HealthySet] = []
        async with contextlib.aclosing(source.snapshots()) as snapshots:
            full = await until(snapshots, lambda s: len(s.shards) == 2, seen)
        assert seen[0].shards == ()  # one success is not enough
        assert len(seen) >= FAST.success_threshold
        assert set(full.probe_ok_at) == {"shard-0", "shard-1"}
        assert full.shards == tuple(fleet.shards)
        assert source.phases() == {"shard-0": HealthPhase.HEALTHY, "shard-1": HealthPhase.HEALTHY}


async def test_killed_shard_leaves_the_set_and_returns_after_restart() -> None:
    async with SimFleet(2) as fleet:
        source = LocalShardSource(fleet.shards, FAST)
        async with contextlib.aclosing(source.snapshots()) as snapshots:
            before = await until(snapshots, lambda s: len(s.shards) == 2)
            await fleet.kill("shard-0")
            seen: list[HealthySet] = []
            await until(snapshots, lambda s: "shard-0" not in s.names(), seen)
            assert all("shard-1" in s.names() for s in seen)  # the survivor never left
            state = source.states["shard-0"]
            assert state.phase is HealthPhase.UNHEALTHY
            assert state.last_reason is ProbeReason.CONNECT
            await fleet.restart("shard-0")
            back = await until(snapshots, lambda s: "shard-0" in s.names())
        assert back.probe_ok_at["shard-0"] > before.probe_ok_at["shard-0"]


async def test_hung_shard_leaves_the_set_on_probe_timeouts() -> None:
    async with SimFleet(2) as fleet:
        source = LocalShardSource(fleet.shards, FAST)
        async with contextlib.aclosing(source.snapshots()) as snapshots:
            await until(snapshots, lambda s: len(s.shards) == 2)
            fleet.hang("shard-1")
            after = await until(snapshots, lambda s: "shard-1" not in s.names())
            assert after.names() == {"shard-0"}
            assert source.states["shard-1"].last_reason is ProbeReason.TIMEOUT
            fleet.resume("shard-1")
            await until(snapshots, lambda s: "shard-1" in s.names())


async def test_a_shard_serving_the_wrong_model_never_joins() -> None:
    async with SimFleet(2, faults={"shard-1": SimFaults(wrong_model="impostor")}) as fleet:
        source = LocalShardSource(fleet.shards, FAST.model_copy(update={"check_model": True}))
        seen: list[HealthySet] = []
        async with contextlib.aclosing(source.snapshots()) as snapshots:
            # Each target has its own probe timer: shard-1 may fail out before shard-0 has joined, so wait for both.
            await until(
                snapshots,
                lambda s: source.states["shard-1"].phase is HealthPhase.UNHEALTHY and "shard-0" in s.names(),
                seen,
            )
        assert all("shard-1" not in s.names() for s in seen)
        assert "shard-0" in seen[-1].names()
        assert source.states["shard-1"].last_reason is ProbeReason.WRONG_MODEL
        assert "impostor" in (source.states["shard-1"].last_error or "")


async def test_flapping_health_keeps_a_suspect_shard_serving() -> None:
    async with SimFleet(1) as fleet:
        source = LocalShardSource(fleet.shards, FAST)
        async with contextlib.aclosing(source.snapshots()) as snapshots:
            await until(snapshots, lambda s: len(s.shards) == 1)
            await fleet.set_faults("shard-0", unhealthy=True)
            suspect = await until(snapshots, lambda s: source.states["shard-0"].phase is HealthPhase.SUSPECT)
            assert suspect.names() == {"shard-0"}  # one failed probe does not take it out
            await fleet.set_faults("shard-0", unhealthy=False)
            await until(snapshots, lambda s: source.states["shard-0"].phase is HealthPhase.HEALTHY)


async def test_draining_takes_a_shard_out_at_once() -> None:
    async with SimFleet(2) as fleet:
        source = LocalShardSource(fleet.shards, FAST)
        async with contextlib.aclosing(source.snapshots()) as snapshots:
            await until(snapshots, lambda s: len(s.shards) == 2)
            await source.set_draining("shard-0")
            drained = await anext(snapshots)
            assert drained.names() == {"shard-1"}
            assert source.phases()["shard-0"] is HealthPhase.DRAINING
            await source.set_draining("shard-0", False)
            assert (await anext(snapshots)).names() == {"shard-0", "shard-1"}


async def test_a_metadata_endpoint_is_never_contacted_and_never_serves() -> None:
    source = LocalShardSource([Shard(name="evil", endpoint="http://169.254.169.254")], FAST)
    async with contextlib.aclosing(source.snapshots()) as snapshots:
        snapshot = await anext(snapshots)
    assert snapshot.shards == ()
    assert source.states["evil"].last_reason is ProbeReason.FORBIDDEN_TARGET


async def test_only_one_probe_loop_runs_per_source() -> None:
    source = LocalShardSource([Shard(name="evil", endpoint="http://169.254.169.254")], FAST)
    async with contextlib.aclosing(source.snapshots()) as first:
        await anext(first)
        async with contextlib.aclosing(source.snapshots()) as second:
            with pytest.raises(RuntimeError, match="already being iterated"):
                await anext(second)
    async with contextlib.aclosing(source.snapshots()) as again:  # free again once the first loop closed
        await anext(again)
