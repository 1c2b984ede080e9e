"""bench/vllm_overhead.py runs at tiny size against the shared servers so that it cannot rot (numbers are not
asserted: two shared cores make them the machine's, not the code's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rollout_runtime.vllm import VllmServer

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_vllm_overhead_smoke_run(vllm_shared: list[VllmServer]) -> None:
    argv = [sys.executable, str(BENCH / "vllm_overhead.py"), "--smoke"]
    for server in vllm_shared:
        argv += ["--url", server.url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    assert "router  adds" in done.stdout
    assert "library adds" in done.stdout
