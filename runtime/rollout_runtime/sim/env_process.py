"""Start ``rollout-fleet sim-env`` as a real subprocess, and stop it by its pid.

For tests, the demo and the chaos suite: :func:`spawn_env_server` starts the server on a free 127.0.0.1 port (the
kernel picks it; the child reports it on its ``SIM_ENV_READY`` line), :meth:`SimEnvProcess.kill` is a real
``kill -9``, :meth:`SimEnvProcess.stop` a graceful SIGTERM. Restart by spawning again with the same
``checkpoint_dir`` (and, if the URL must stay the same, the same ``port``). The process itself is a
:class:`~rollout_runtime.sim.process.ManagedProcess`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from rollout_runtime.sim.process import ManagedProcess

__all__ = ["SimEnvProcess", "spawn_env_server"]

READY_PREFIX = "SIM_ENV_READY "


@dataclass
class SimEnvProcess:
    """A running sim-env subprocess."""

    kind: str
    host: str
    port: int
    log_path: Path
    checkpoint_dir: Path | None
    process: ManagedProcess = field(repr=False)

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None  # spawn_env_server returns started processes only
        return pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process.running

    async def kill(self) -> None:
        """``kill -9`` this pid (no cleanup runs: that is the point) and reap it."""
        await self.process.kill_async()

    async def stop(self, timeout_seconds: float = 15.0) -> None:
        """SIGTERM (graceful: episodes in flight are cleaned up), then SIGKILL if it does not exit in time."""
        await self.process.stop_async(timeout_seconds)

    def log_tail(self, lines: int = 40) -> str:
        return self.process.tail(lines)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def spawn_env_server(
    kind: str,
    *,
    checkpoint_dir: Path | str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    log_path: Path | str | None = None,
    extra_args: tuple[str, ...] = (),
    ready_timeout_seconds: float = 60.0,
) -> SimEnvProcess:
    """Start ``sim-env --kind <kind>`` and return once it listens (its READY line names the port)."""
    argv = [sys.executable, "-m", "rollout_runtime.cli.sim_env", "--kind", kind, "--host", host, "--port", str(port),
            "--exit-with-parent"]  # fmt: skip
    if checkpoint_dir is not None:
        argv += ["--checkpoint-dir", os.fspath(checkpoint_dir)]
    argv += list(extra_args)
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix=f"sim-env-{kind}-", suffix=".log")
        os.close(handle)
        log_path = name
    log = Path(log_path)
    process = ManagedProcess(f"sim-env {kind}", argv, log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    process.start()
    try:
        ready = await process.wait_ready_line(READY_PREFIX, ready_timeout_seconds)
    except BaseException:
        await process.kill_async()
        raise
    return SimEnvProcess(
        kind=kind,
        host=host,
        port=int(ready["port"]),
        log_path=log,
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        process=process,
    )
