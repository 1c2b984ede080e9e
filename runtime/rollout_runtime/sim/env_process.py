"""Start ``rollout-fleet sim-env`` as a real subprocess, and stop it by its pid.

For tests, the demo and the chaos suite: :func:`spawn_env_server` starts the server on a free 127.0.0.1 port (the
kernel picks it; the child reports it on its ``SIM_ENV_READY`` line), :meth:`SimEnvProcess.kill` is a real
``kill -9``, :meth:`SimEnvProcess.stop` a graceful SIGTERM. Restart by spawning again with the same
``checkpoint_dir`` (and, if the URL must stay the same, the same ``port``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["SimEnvProcess", "spawn_env_server"]

READY_PREFIX = "SIM_ENV_READY "


@dataclass
class SimEnvProcess:
    """A running sim-env subprocess."""

    kind: str
    host: str
    port: int
    pid: int
    log_path: Path
    checkpoint_dir: Path | None
    process: asyncio.subprocess.Process = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    async def kill(self) -> None:
        """``kill -9`` this pid (no cleanup runs: that is the point) and reap it."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        await self.process.wait()

    async def stop(self, timeout_seconds: float = 15.0) -> None:
        """SIGTERM (graceful: episodes in flight are cleaned up), then SIGKILL if it does not exit in time."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout_seconds)
            except TimeoutError:
                await self.kill()
        await self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

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
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    stderr = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env
        )
    finally:
        os.close(stderr)
    try:
        ready = await asyncio.wait_for(_read_ready(process), ready_timeout_seconds)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if ready is None:
        await process.wait()
        tail = _tail(log, 30)
        raise RuntimeError(f"sim-env {kind} exited with {process.returncode} before it was ready; log tail:\n{tail}")
    return SimEnvProcess(
        kind=kind,
        host=host,
        port=int(ready["port"]),
        pid=process.pid,
        log_path=log,
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        process=process,
    )


async def _read_ready(process: asyncio.subprocess.Process) -> dict[str, Any] | None:
    assert process.stdout is not None
    while line := await process.stdout.readline():
        text = line.decode(errors="replace").strip()
        if text.startswith(READY_PREFIX):
            ready: dict[str, Any] = json.loads(text[len(READY_PREFIX) :])
            return ready
    return None


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path})"
