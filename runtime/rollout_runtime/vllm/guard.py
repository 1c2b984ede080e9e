"""``python guard.py ARGV...`` (run as a script): run a vLLM server so that nothing of it outlives its parent.

The guard leads a new session (its starter passes ``start_new_session``), runs ARGV as its child in that process
group, prints ``VLLM_GUARD {"pid": <child pid>}`` and then waits on its stdin, a pipe whose other end only its
parent holds. When that end closes (the parent exited, however it died: a test run killed by its timeout exits
without running any teardown) the guard SIGKILLs the whole group: the API server, its engine core and their
helpers. ``setpriv --pdeathsig`` cannot do this: the engine core is the API server's child, not ours, and it keeps
running after the API server dies. A SIGTERM to the group (a normal stop) ends the guard like the rest.

The child's death alone does not end the guard: a test that SIGKILLs the API server then finds the engine core
orphaned (what vLLM really does), and the starter's stop sweeps the group. Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys

READY_PREFIX = "VLLM_GUARD "


def main(argv: list[str]) -> int:
    if not argv:
        print(f"usage: {sys.executable} {__file__} ARGV...", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    print(READY_PREFIX + json.dumps({"pid": child.pid}), flush=True)
    while True:
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], 1.0)
        child.poll()  # reap the child when it dies, so its pid does not linger as a zombie
        if readable and not os.read(sys.stdin.fileno(), 4096):
            os.killpg(0, signal.SIGKILL)  # the parent is gone: nothing of the group may outlive it
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
