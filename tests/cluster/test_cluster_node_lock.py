"""The node's machine-wide lock comes before anything ``up`` reads or changes on the host, its "before" snapshot
included: a snapshot taken while another session's node holds the lock would record that node's bridge, tables and
mounts as the host's own and fail this session's check when they are gone.

It runs first in the tier (file-name order), before the session's node takes the lock; no node is brought up.
"""

from __future__ import annotations

import fcntl
import sys
import time
from pathlib import Path

import pytest

import node as node_tool  # tools/node.py
from support.node import NODE_PY, UP_TIMEOUT
from support.processes import ManagedProcess, wait_until

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
