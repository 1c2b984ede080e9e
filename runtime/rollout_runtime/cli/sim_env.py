"""``rollout-fleet sim-env``: serve one of the example environment servers.

Prints exactly one machine-readable line on stdout once listening, so a parent can start it on port 0::

    SIM_ENV_READY {"host": "127.0.0.1", "port": 41234, "pid": 123, "kind": "multistep", "url": "http://..."}

Logs go to stderr. SIGTERM or SIGINT stop it gracefully (episodes in flight are cleaned up).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import click

from rollout_runtime.cli.options import (
    EXIT_WITH_PARENT,
    HOST,
    PORT,
    command_help,
    config_from_options,
    log_level,
    serve_until_stopped,
)
from rollout_runtime.environment import EnvironmentServerConfig

READY_PREFIX = "SIM_ENV_READY "
KINDS = ("verifier", "multistep")


@click.command(
    "sim-env", help=command_help("sim-env", "verifier: arithmetic, scored 1/0; multistep: a checkpointed running sum.")
)
@click.option("--kind", type=click.Choice(KINDS), required=True, help="Which example environment to serve.")
@HOST
@PORT
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Durable partial-rollout checkpoints live here (off when absent).",
)
@click.option("--max-concurrent-episodes", type=click.IntRange(min=1), default=None)
@click.option("--max-queued-episodes", type=click.IntRange(min=0), default=64, show_default=True)
@click.option("--admission-timeout", type=float, default=None, help="Seconds; required with a concurrency limit.")
@click.option("--episode-timeout", type=float, default=None, help="Seconds; none by default.")
@click.option("--cleanup-timeout", type=float, default=10.0, show_default=True)
@click.option(
    "--duplicate-attempt-wait",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds a second attempt of a live episode_id waits before it is refused (409); 0 refuses at once.",
)
@EXIT_WITH_PARENT
@log_level("INFO")
def sim_env(
    kind: str,
    host: str,
    port: int,
    checkpoint_dir: Path | None,
    max_concurrent_episodes: int | None,
    max_queued_episodes: int,
    admission_timeout: float | None,
    episode_timeout: float | None,
    cleanup_timeout: float,
    duplicate_attempt_wait: float,
    exit_with_parent: bool,
    log_level: str,
) -> None:
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from_options(
        EnvironmentServerConfig,
        renamed={
            "admission_timeout_seconds": "--admission-timeout",
            "default_episode_timeout_seconds": "--episode-timeout",
            "cleanup_timeout_seconds": "--cleanup-timeout",
            "duplicate_attempt_wait_seconds": "--duplicate-attempt-wait",
        },
        host=host,
        port=port,
        checkpoint_dir=checkpoint_dir,
        max_concurrent_episodes=max_concurrent_episodes,
        max_queued_episodes=max_queued_episodes,
        admission_timeout_seconds=admission_timeout,
        default_episode_timeout_seconds=episode_timeout,
        cleanup_timeout_seconds=cleanup_timeout,
        duplicate_attempt_wait_seconds=duplicate_attempt_wait,
    )
    serve_until_stopped(_serve(kind, config, exit_with_parent=exit_with_parent), host, port)


async def _serve(kind: str, config: EnvironmentServerConfig, *, exit_with_parent: bool) -> None:
    from rollout_runtime.sim.environments import SIM_ENVIRONMENTS

    parent = os.getppid()  # before readiness is announced: a parent may exit the moment it reads the ready line
    server = SIM_ENVIRONMENTS[kind](config)
    running = await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready = {"host": config.host, "port": running.port, "pid": os.getpid(), "kind": kind, "url": running.url}
    print(READY_PREFIX + json.dumps(ready), flush=True)
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                if exit_with_parent and os.getppid() != parent:
                    logging.getLogger(__name__).warning("sim-env: parent %d is gone, exiting", parent)
                    break
    finally:
        await running.stop()


if __name__ == "__main__":
    sim_env()
