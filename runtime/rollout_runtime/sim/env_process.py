"""Start ``rollout-fleet sim-env`` as a real subprocess, and stop it by its pid.

For tests, the demo and the chaos suite: :func:`spawn_env_server` starts the server on a free 127.0.0.1 port (the
kernel picks it; the child reports it on its ``SIM_ENV_READY`` line), :meth:`SimEnvProcess.kill` is a real
``kill -9``, :meth:`SimEnvProcess.stop` a graceful SIGTERM. Restart by spawning again with the same
``checkpoint_dir`` (and, if the URL must stay the same, the same ``port``). The process itself is a
:class:`~rollout_runtime.sim.process.ManagedProcess`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rollout_runtime.sim.process import ServerProcess, spawn_python_server

__all__ = ["SimEnvProcess", "spawn_env_server"]

READY_PREFIX = "SIM_ENV_READY "


@dataclass
class SimEnvProcess(ServerProcess):
    """A running sim-env subprocess (:meth:`stop` is graceful: episodes in flight are cleaned up)."""

    kind: str
    checkpoint_dir: Path | None


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
    args = ["--kind", kind, "--host", host, "--port", str(port), "--exit-with-parent"]
    if checkpoint_dir is not None:
        args += ["--checkpoint-dir", os.fspath(checkpoint_dir)]
    args += list(extra_args)
    process, log, ready = await spawn_python_server(
        f"sim-env {kind}",
        "rollout_runtime.cli.sim_env",
        args,
        ready_prefix=READY_PREFIX,
        log_path=log_path,
        ready_timeout_seconds=ready_timeout_seconds,
    )
    return SimEnvProcess(
        host=host,
        port=int(ready["port"]),
        log_path=log,
        process=process,
        kind=kind,
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
    )
