"""Each benchmark runs at tiny size in the suite so that it cannot rot (numbers are not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("classification.py", "8-deep chain"),
        ("dispatch_overhead.py", "Dispatcher                  :"),
        ("dispatch_scale.py", "dispatch scale ratios"),
        ("operator_scale.py", "operator scale ratios"),
        ("router_overhead.py", "router overhead vs nginx"),
        ("backpressure.py", "backpressure vs the capacity bound"),
        ("quality.py", "mismatch +1 sd"),
    ],
)
def test_benchmark_smoke_run(script: str, expected: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke"], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_weights_benchmark_smoke_run_commits_no_stale_result_when_weights_aware() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "failover.py"), "--weights", "--smoke"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.startswith("weights-")}
    assert set(rows) == {"weights-aware", "weights-unaware"}, done.stdout
    assert rows["weights-aware"][2] == "0", done.stdout  # the stale-committed column
