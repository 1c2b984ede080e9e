"""``rollout-fleet sim-shard``: serve a simulated OpenAI-compatible generation shard (see rollout_runtime.sim.shard).

On startup it prints one machine-readable line on stdout, ``SIM_SHARD_READY {"host": ..., "port": ..., "pid": ...,
"model": ...}``, so a parent can pass ``--port 0`` and read the port the kernel chose. Runnable without the
console script as ``python -m rollout_runtime.cli.sim_shard``.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

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
from rollout_runtime.sim.shard import READY_PREFIX, SimShardConfig, serve


def _print_ready(info: dict[str, Any]) -> None:
    sys.stdout.write(READY_PREFIX + json.dumps(info, sort_keys=True) + "\n")
    sys.stdout.flush()


@click.command(
    "sim-shard",
    help=command_help("sim-shard", "Faults: set by the flags below at start, at runtime through /admin/faults."),
)
@HOST
@PORT
@click.option("--model", default="sim-model", show_default=True, help="Model name served by /v1/models.")
@click.option("--max-model-len", type=click.IntRange(min=1), default=4096, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for fault rates.")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=1024 * 1024, show_default=True)
@click.option("--hang", is_flag=True, help="Fault: accept requests but never answer.")
@click.option("--slow", "slow_seconds", type=click.FloatRange(min=0), default=0.0, help="Fault: added latency (s).")
@click.option("--error-rate", type=click.FloatRange(0, 1), default=0.0, help="Fault: fraction answered with an error.")
@click.option("--error-status", type=click.IntRange(400, 599), default=503, show_default=True)
@click.option("--fail-next", type=click.IntRange(min=0), default=0, help="Fault: the next N requests fail.")
@click.option("--drop-rate", type=click.FloatRange(0, 1), default=0.0, help="Fault: fraction cut off mid-response.")
@click.option("--wrong-model", default=None, help="Fault: serve this model name instead.")
@click.option("--unhealthy", is_flag=True, help="Fault: /health answers 503.")
@click.option(
    "--flap",
    "flap_seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Fault: alternate this many seconds up and down.",
)
@click.option("--crash-after", type=click.IntRange(min=1), default=None, help="Fault: exit on the Nth request.")
@EXIT_WITH_PARENT
@log_level("WARNING")
def sim_shard(
    host: str,
    port: int,
    model: str,
    max_model_len: int,
    seed: int,
    max_body_bytes: int,
    hang: bool,
    slow_seconds: float,
    error_rate: float,
    error_status: int,
    fail_next: int,
    drop_rate: float,
    wrong_model: str | None,
    unhealthy: bool,
    flap_seconds: float | None,
    crash_after: int | None,
    exit_with_parent: bool,
    log_level: str,
) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = config_from_options(
        SimShardConfig,
        model=model,
        max_model_len=max_model_len,
        seed=seed,
        max_body_bytes=max_body_bytes,
        faults={
            "hang": hang,
            "slow_seconds": slow_seconds,
            "error_rate": error_rate,
            "error_status": error_status,
            "fail_next": fail_next,
            "drop_rate": drop_rate,
            "wrong_model": wrong_model,
            "unhealthy": unhealthy,
            "flap_seconds": flap_seconds,
            "crash_after_requests": crash_after,
        },
    )
    serve_until_stopped(serve(config, host, port, exit_with_parent=exit_with_parent, ready=_print_ready), host, port)


if __name__ == "__main__":
    sim_shard()
