"""Measurements of a running process from Linux's /proc, for the benchmarks that report another process's cost.
Imported as a sibling module (``python bench/<script>.py`` puts bench/ first on the path)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds", "process_tree", "rss_mib"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory of a process now, in MiB (/proc/<pid>/status); 0 if it reports none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants now (/proc/<pid>/task/*/children): an nginx master and its workers."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        for child in children:
            found.extend(process_tree(int(child)))
    return found
