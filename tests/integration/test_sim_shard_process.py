"""Sim shards as real subprocesses (SimFleet): started on kernel ports, killed, stopped and crashed for real."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from rollout_runtime.health import HttpProber, ProbeReason, ProbeResult, ProbeSettings, ProbeTargetPolicy
from rollout_runtime.shards import Shard
from rollout_runtime.sim import SimFaults, SimFleet, SimFleetError

PROBE = ProbeSettings(period_seconds=1.0, timeout_seconds=0.5)


async def probe(prober: HttpProber, shard: Shard) -> ProbeResult:
    """Probe a shard as the health monitor does: its health path, then its model when it names one."""
    return await prober.probe(shard.endpoint, PROBE, expected_model=shard.model or None)


def gone(pid: int) -> bool:
    """The pid no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


async def test_fleet_starts_shards_on_kernel_ports_and_stops_every_pid_on_exit() -> None:
    async with SimFleet(2) as fleet, HttpProber(ProbeTargetPolicy.local()) as prober:
        pids = [fleet.pid(name) for name in fleet.names]
        endpoints = {shard.endpoint for shard in fleet.shards}
        assert len(endpoints) == 2
        results = [await probe(prober, shard) for shard in fleet.shards]
        assert all(r.ok for r in results), results
        log_dir = fleet.log_dir
    assert all(pid is not None and gone(pid) for pid in pids)
    assert not log_dir.exists()


async def test_killed_shard_refuses_connections_and_restarts_on_the_same_endpoint() -> None:
    async with SimFleet(1) as fleet, HttpProber(ProbeTargetPolicy.local()) as prober:
        (shard,) = fleet.shards
        old_pid = fleet.pid(shard.name)
        assert await fleet.kill(shard.name) == -signal.SIGKILL
        assert not fleet.alive(shard.name)
        assert (await probe(prober, shard)).reason is ProbeReason.CONNECT
        restarted = await fleet.restart(shard.name)
        assert restarted == shard
        assert fleet.pid(shard.name) != old_pid
        assert (await probe(prober, shard)).ok


async def test_stopped_shard_times_out_probes_until_resumed() -> None:
    async with SimFleet(1) as fleet, HttpProber(ProbeTargetPolicy.local()) as prober:
        (shard,) = fleet.shards
        fleet.hang(shard.name)
        assert (await probe(prober, shard)).reason is ProbeReason.TIMEOUT
        fleet.resume(shard.name)
        assert (await probe(prober, shard)).ok


async def test_crash_fault_makes_the_process_exit() -> None:
    async with SimFleet(1) as fleet:
        (name,) = fleet.names
        await fleet.set_faults(name, crash=True)
        assert await fleet.wait_exit(name) == 3


async def test_crash_after_requests_exits_on_the_nth_generation_request() -> None:
    async with SimFleet(1, faults={"shard-0": SimFaults(crash_after_requests=2)}) as fleet:
        url = fleet.shards[0].endpoint + "/v1/completions"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={"prompt": "hi"}) as response:
                assert response.status == 200
            with pytest.raises(aiohttp.ClientError):
                async with http.post(url, json={"prompt": "hi"}) as response:
                    await response.read()
        assert await fleet.wait_exit("shard-0") == 3


async def test_cli_flags_set_the_initial_faults() -> None:
    async with (
        SimFleet(1, model="m", extra_args=("--wrong-model", "other")) as fleet,
        HttpProber(ProbeTargetPolicy.local()) as prober,
    ):
        result = await probe(prober, fleet.shards[0])
    assert result.reason is ProbeReason.WRONG_MODEL
    assert "'m'" in result.message
    assert "'other'" in result.message


async def test_set_faults_through_the_fleet_reaches_the_shard() -> None:
    async with SimFleet(1) as fleet, HttpProber(ProbeTargetPolicy.local()) as prober:
        (shard,) = fleet.shards
        faults = await fleet.set_faults(shard.name, unhealthy=True)
        assert faults.unhealthy
        assert (await probe(prober, shard)).reason is ProbeReason.STATUS
        await fleet.clear_faults()
        assert (await probe(prober, shard)).ok
        with pytest.raises(SimFleetError, match="error_rate"):
            await fleet.set_faults(shard.name, error_rate=5)


async def test_a_shard_that_cannot_start_fails_the_fleet_with_its_log() -> None:
    with pytest.raises(SimFleetError, match="max-model-len"):
        async with SimFleet(1, extra_args=("--max-model-len", "0")):
            pass


def test_a_shard_exits_by_itself_when_its_parent_dies() -> None:
    parent_code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-m', 'rollout_runtime.cli.sim_shard', '--exit-with-parent'],"
        " stdout=subprocess.PIPE)\n"
        "sys.stdout.write(child.stdout.readline().decode()); sys.stdout.flush()\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", parent_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    ) as parent:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline().split(b'"pid": ')[1].split(b",")[0])
        child = os.pidfd_open(child_pid)  # becomes readable when the child exits: an event, not a guess
        try:
            assert not gone(child_pid)
            parent.kill()
            parent.wait()
            readable, _, _ = select.select([child], [], [], 30)
            assert readable, f"sim shard {child_pid} outlived its parent"
        finally:
            os.close(child)
            if gone(child_pid) is False:
                os.kill(child_pid, signal.SIGKILL)
