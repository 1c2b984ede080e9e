"""What several ``rollout-fleet`` commands share: their options and help text, defined once.

The simulated servers (``sim-shard``, ``sim-env``) are started by spawners (``SimFleet``, the tests, the demo) with
the same flags; one definition here keeps the flags, defaults and help the same on both.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click
from pydantic import BaseModel, ValidationError

from rollout_runtime.cli import command_summary
from rollout_runtime.cli.errors import describe_validation_error, one_line_usage

__all__ = [
    "DEFAULT_EVENT_LOOP",
    "EVENT_LOOPS",
    "EXIT_WITH_PARENT",
    "HOST",
    "LOG_LEVELS",
    "PORT",
    "PORT_NUMBER",
    "command_help",
    "config_from_options",
    "log_level",
    "loop_factory",
    "serve_until_stopped",
]

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=BaseModel)

PORT_NUMBER = click.IntRange(0, 65535)
"""A TCP port to bind; 0 lets the kernel pick."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

HOST = click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
PORT = click.option("--port", type=PORT_NUMBER, default=0, show_default=True, help="0: the kernel picks a free port.")
EVENT_LOOPS = ("uvloop", "asyncio")
DEFAULT_EVENT_LOOP = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
"""uvloop where it is installed (a dependency everywhere but Windows, which it does not support)."""

EXIT_WITH_PARENT = click.option(
    "--exit-with-parent", is_flag=True, help="Exit when the parent process goes away (for spawners)."
)


def log_level(default: str) -> Callable[[F], F]:
    """``--log-level``; each server picks its own default (a shard is quiet, an environment server chatty)."""
    return click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default=default,
        show_default=True,
        help="Python logging level.",
    )


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The ``asyncio.Runner`` loop factory for an ``--event-loop`` choice (None: asyncio's own)."""
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        raise click.UsageError("--event-loop uvloop: uvloop is not installed; use --event-loop asyncio") from None
    return uvloop.new_event_loop


def config_from_options(model: type[M], /, renamed: dict[str, str] | None = None, **values: Any) -> M:
    """``model(**values)``, where a value the model refuses (a cross-field rule the options' types cannot state) is
    a usage error naming the option. ``renamed`` maps a field to its flag where the two names differ."""
    try:
        return model(**values)
    except ValidationError as error:
        ctx = click.get_current_context(silent=True)
        flags = {p.name: max(p.opts, key=len) for p in (ctx.command.params if ctx else []) if p.name}
        message = describe_validation_error(error, {**flags, **(renamed or {})})
        raise one_line_usage(click.UsageError(message, ctx)) from None


def command_help(name: str, details: str = "") -> str:
    """A subcommand's ``--help``: the one-line summary ``rollout-fleet --help`` lists for it, then ``details``."""
    summary = command_summary(name)
    return f"{summary}\n\n{details}" if details else summary


def serve_until_stopped(server: Coroutine[Any, Any, None], host: str, port: int, event_loop: str = "asyncio") -> None:
    """Run a server's main coroutine on ``event_loop`` (an ``--event-loop`` choice); a bind failure (the port is
    taken) is a clean CLI error, not a traceback."""
    try:
        with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
            runner.run(server)
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc}") from None
