"""``rollout-fleet router`` as a subprocess (for tests, benchmarks and the demo), stopped by its pid."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollout_runtime.router.app import READY_PREFIX
from rollout_runtime.sim.process import ServerProcess, spawn_python_server

__all__ = ["RouterProcess", "spawn_router"]


@dataclass
class RouterProcess(ServerProcess):
    """A running router subprocess."""

    event_loop: str
    """The module of the event loop it runs on (its ready line says): ``uvloop`` unless ``--event-loop asyncio``."""


async def spawn_router(
    args: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    log_path: Path | str | None = None,
    ready_timeout_seconds: float = 60.0,
) -> RouterProcess:
    """Start ``rollout-fleet router <args>`` and return once it listens (its ready line names the port)."""
    argv = ["--host", host, "--port", str(port), "--exit-with-parent", *args]
    process, log, ready = await spawn_python_server(
        "router",
        "rollout_runtime.cli.router",
        argv,
        ready_prefix=READY_PREFIX,
        log_path=log_path,
        ready_timeout_seconds=ready_timeout_seconds,
    )
    return RouterProcess(
        host=host, port=int(ready["port"]), log_path=log, process=process, event_loop=str(ready["event_loop"])
    )
