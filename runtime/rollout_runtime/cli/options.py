"""What several ``rollout-fleet`` commands share: their options and help text, defined once.

The simulated servers (``sim-shard``, ``sim-env``) are started by spawners (``SimFleet``, the tests, the demo) with
the same flags; one definition here keeps the flags, defaults and help the same on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click

from rollout_runtime.cli import command_summary

__all__ = ["EXIT_WITH_PARENT", "HOST", "PORT", "command_help", "log_level", "serve_until_stopped"]

F = TypeVar("F", bound=Callable[..., Any])

HOST = click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
PORT = click.option(
    "--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0: the kernel picks a free port."
)
EXIT_WITH_PARENT = click.option(
    "--exit-with-parent", is_flag=True, help="Exit when the parent process goes away (for spawners)."
)


def log_level(default: str) -> Callable[[F], F]:
    """``--log-level``; each server picks its own default (a shard is quiet, an environment server chatty)."""
    return click.option("--log-level", default=default, show_default=True, help="Python logging level.")


def command_help(name: str, details: str = "") -> str:
    """A subcommand's ``--help``: the one-line summary ``rollout-fleet --help`` lists for it, then ``details``."""
    summary = command_summary(name)
    return f"{summary}\n\n{details}" if details else summary


def serve_until_stopped(server: Coroutine[Any, Any, None], host: str, port: int) -> None:
    """Run a server's main coroutine; a bind failure (the port is taken) is a clean CLI error, not a traceback."""
    try:
        asyncio.run(server)
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc}") from None
