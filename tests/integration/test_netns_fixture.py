"""The network namespace fixture (tests/support/netns.py): a real namespace + veth pair, a real sim shard inside,
reachable from the host only through the veth's /24, nothing left behind, also when setting it up fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from rollout_runtime.sim.shard import READY_PREFIX
from support import netns
from support.netns import NetworkNamespace


def namespaces() -> set[str]:
    listing = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {entry["name"] for entry in json.loads(listing or "[]")}


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, check=False).returncode == 0


def routes_inside(ns: NetworkNamespace) -> list[str]:
    listing = subprocess.run(["ip", "-j", "-n", ns.name, "route"], capture_output=True, text=True, check=True).stdout
    return [route["dst"] for route in json.loads(listing)]


async def test_a_process_in_the_namespace_is_reached_through_the_veth_only(
    network_namespace: NetworkNamespace, tmp_path: Path
) -> None:
    ns = network_namespace
    assert ns.name in namespaces()
    assert routes_inside(ns) == [str(ns.subnet)], "no default route inside"
    shard = ns.process(
        "sim-in-netns",
        [sys.executable, "-m", "rollout_runtime.cli.sim_shard", "--host", ns.ip, "--port", "0"],
        tmp_path / "sim.log",
    )
    shard.start()
    try:
        port = int((await shard.wait_ready_line(READY_PREFIX, 60))["port"])
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(f"http://{ns.ip}:{port}/health") as response:
                assert response.status == 200
            with pytest.raises(aiohttp.ClientConnectionError):  # another network stack: not on the host's loopback
                async with http.get(f"http://127.0.0.1:{port}/health"):
                    pass
    finally:
        shard.stop()


def test_a_failed_setup_removes_what_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    real_ip = netns._ip
    made: list[str] = []

    def failing_ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if args[:2] == ("netns", "add"):
            made.append(args[2])
        if args[:2] == ("addr", "add"):
            raise subprocess.CalledProcessError(2, ["ip", *args], stderr="injected")
        return real_ip(*args, check=check)

    monkeypatch.setattr(netns, "_ip", failing_ip)
    with pytest.raises(subprocess.CalledProcessError, match="returned non-zero"):
        netns.create()
    assert made, "the fault hit after the namespace was made"
    assert made[-1] not in namespaces()
    index = made[-1].split("-")[1]
    assert not link_exists(f"rfh{index}")


def test_teardown_removes_the_namespace_and_both_veth_ends() -> None:
    ns = netns.create()
    assert ns.name in namespaces()
    assert link_exists(ns.host_interface)
    netns.delete(ns)
    assert ns.name not in namespaces()
    assert not link_exists(ns.host_interface)
