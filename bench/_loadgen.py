"""bench/loadgen (Go), the router benchmark's client: located in the tool cache and run once per measured round.
Imported as a sibling module (``python bench/<script>.py`` puts bench/ first on the path)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _peers import installed_tool

__all__ = ["INSTALL", "LoadgenMissing", "LoadgenResult", "loadgen", "loadgen_binary"]

SOURCE = Path(__file__).with_name("loadgen")
INSTALL = "bash scripts/install-tools.sh loadgen"


class LoadgenMissing(RuntimeError):
    """bench/loadgen is not built for this checkout's source; the message says how to build it."""


@dataclass(frozen=True)
class LoadgenResult:
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int


def loadgen_binary() -> Path:
    """The binary scripts/install-tools.sh built from this source (its directory is named by the source's hash)."""
    key = hashlib.sha256((SOURCE / "go.mod").read_bytes() + (SOURCE / "main.go").read_bytes()).hexdigest()[:12]
    binary = installed_tool(f"loadgen-{key}", "loadgen")
    if not isinstance(binary, Path):
        raise LoadgenMissing(f"bench/loadgen is not built at {binary}: run `{INSTALL}`")
    return binary


async def loadgen(urls: Sequence[str], requests: int, concurrency: int, model: str = "") -> LoadgenResult:
    """``requests`` completions, ``concurrency`` at a time, round-robin over ``urls`` (after one warm-up request per
    worker); each body names ``model`` unless it is empty."""
    process = await asyncio.create_subprocess_exec(
        str(loadgen_binary()), "-c", str(concurrency), "-n", str(requests), "-model", model, *urls,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"loadgen exited {process.returncode}: {err.decode(errors='replace').strip()}")
    result = json.loads(out)
    return LoadgenResult(result["p50_ms"], result["p99_ms"], result["rps"], result["errors"])
