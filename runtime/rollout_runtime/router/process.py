"""``rollout-fleet router`` as a subprocess (for tests, benchmarks and the demo), stopped by its pid."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from rollout_runtime.router.app import READY_PREFIX
from rollout_runtime.sim.process import ManagedProcess

__all__ = ["RouterProcess", "spawn_router"]


@dataclass
class RouterProcess:
    """A running router subprocess."""

    host: str
    port: int
    log_path: Path
    process: ManagedProcess = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self, timeout_seconds: float = 15.0) -> None:
        await self.process.stop_async(timeout_seconds)

    def log_tail(self, lines: int = 40) -> str:
        return self.process.tail(lines)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def spawn_router(
    args: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    log_path: Path | str | None = None,
    ready_timeout_seconds: float = 60.0,
) -> RouterProcess:
    """Start ``rollout-fleet router <args>`` and return once it listens (its ready line names the port)."""
    argv = [sys.executable, "-m", "rollout_runtime.cli.router", "--host", host, "--port", str(port),
            "--exit-with-parent", *args]  # fmt: skip
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix="router-", suffix=".log")
        os.close(handle)
        log_path = name
    log = Path(log_path)
    process = ManagedProcess("router", argv, log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    process.start()
    try:
        ready = await process.wait_ready_line(READY_PREFIX, ready_timeout_seconds)
    except BaseException:
        await process.kill_async()
        raise
    return RouterProcess(host=host, port=int(ready["port"]), log_path=log, process=process)
