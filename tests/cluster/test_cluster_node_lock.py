"""The node's machine-wide lock comes before anything ``up`` reads or changes on the host, its "before" snapshot
included: a snapshot taken while another session's node holds the lock would record that node's bridge, tables and
mounts as the host's own and fail this session's check when they are gone.

A node whose supervisor was killed outright leaves its bridge, mounts and sysctls behind; the next ``up`` clears them
before its snapshot, so its check compares the host with itself, not with those leftovers.

It runs first in the tier (file-name order), before the session's node takes the lock; no node comes fully up.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
from pathlib import Path

import pytest

import node as node_tool  # tools/node.py
from support.node import NODE_PY, UP_TIMEOUT
from support.processes import ManagedProcess, wait_until
from support.tools import cache_root

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]


def blocked_on_a_flock(pid: int) -> bool:
    """/proc/locks lists a process waiting for a lock as ``N: -> FLOCK ADVISORY WRITE <pid> ...``."""
    return any(
        line.split()[1:3] == ["->", "FLOCK"] and line.split()[5] == str(pid)
        for line in Path("/proc/locks").read_text().splitlines()
    )


def test_up_waits_for_the_lock_before_it_snapshots_the_host(tmp_path: Path) -> None:
    node_tool.LOCK.parent.mkdir(parents=True, exist_ok=True)
    with node_tool.LOCK.open("a+") as held:
        deadline = time.monotonic() + UP_TIMEOUT
        while True:  # another session's node may hold it: wait for it to end, as the node fixture does
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{node_tool.LOCK} stayed held for {UP_TIMEOUT} s"
                time.sleep(1.0)  # polling a lock held by another session, with a deadline
        record = tmp_path / "host-state.json"
        argv = [sys.executable, NODE_PY, "up", "--wait-lock", f"--host-state={record}", f"--images={tmp_path}"]
        up = ManagedProcess("node-up", argv, tmp_path / "up.log")
        up.start()
        try:
            assert up.pid is not None
            wait_until(lambda: blocked_on_a_flock(up.pid or 0), timeout=60, what="up blocked on the lock", process=up)
            assert not record.exists(), "up wrote a host snapshot before it held the lock"
        finally:
            up.stop(timeout=30)  # SIGTERM while it waits: no handler yet, nothing to tear down
        assert not record.exists()


def test_up_clears_a_killed_nodes_leftovers_before_it_snapshots_the_host(tmp_path: Path) -> None:
    """Images missing on purpose: ``up`` changes the host (bridge, sysctls, cgroups) long before it imports them."""
    assert (cache_root() / "tools").exists()
    images = tmp_path / "no-images"
    images.mkdir()
    bridge = Path("/sys/class/net", node_tool.BRIDGE)
    first = ManagedProcess(
        "node-killed", [sys.executable, NODE_PY, "up", "--wait-lock", f"--images={images}"], tmp_path / "killed.log"
    )
    first.start()
    try:
        wait_until(bridge.exists, timeout=UP_TIMEOUT, what="the first node's bridge", process=first)
    finally:
        first.kill()  # SIGKILL the supervisor alone: no teardown runs, its components live on as orphans
    assert bridge.exists(), "the kill left nothing behind: the test would prove nothing"
    record = tmp_path / "host-state.json"
    second = ManagedProcess(
        "node-next",
        [sys.executable, NODE_PY, "up", "--wait-lock", f"--images={images}", f"--host-state={record}"],
        tmp_path / "next.log",
    )
    second.start()
    try:
        wait_until(lambda: not second.running, timeout=UP_TIMEOUT, what="the next up to end")
    finally:
        second.stop(timeout=120)
    assert "pause.tar" in second.tail(), "the next up failed before it changed the host:\n" + second.tail()
    states = json.loads(record.read_text())
    assert not states["before"]["bridge"], "the snapshot recorded the killed node's bridge as the host's own"
    assert states["after"] == states["before"], "the next up did not leave the host as it found it"
    assert not bridge.exists()
