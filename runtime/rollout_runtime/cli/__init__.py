"""The ``rollout-fleet`` command line.

Subcommands live in their own modules and are imported only when invoked, so ``rollout-fleet --help`` stays
fast and the operator's dependencies are not loaded to run the demo.

Errors are reported in one place, :class:`LazyGroup`: every user error is one line on stderr, exit 2 for usage and
1 for runtime errors (see :mod:`rollout_runtime.cli.errors`); ``rollout-fleet --debug <command>`` (or
``ROLLOUT_FLEET_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from rollout_runtime import __version__

# name -> ("module:attribute" of a click.Command, one-line summary). The summary is listed by ``rollout-fleet --help``
# without importing the module, and heads the command's own --help (see ``options.command_help``).
_COMMANDS: dict[str, tuple[str, str]] = {
    "classify": (
        "rollout_runtime.cli.classify:classify",
        "Classify sample failures (and given HTTP statuses) as INFRA or DATA.",
    ),
    "demo": ("rollout_runtime.cli.demo:demo", "Run the local demo fleet: simulated shards, chaos, live metrics."),
    "router": (
        "rollout_runtime.cli.router:router",
        "Serve an OpenAI-compatible router over the fleet's healthy shards, for environment servers.",
    ),
    "sim-shard": ("rollout_runtime.cli.sim_shard:sim_shard", "Serve a simulated OpenAI-compatible generation shard."),
    "sim-env": ("rollout_runtime.cli.sim_env:sim_env", "Serve a simulated environment server."),
    "crds": ("fleet_operator.cli:crds", "Print (or write) the CustomResourceDefinitions generated from the models."),
    "operator": (
        "fleet_operator.cli:operator",
        "Run the fleet operator (kopf) against the current kubeconfig or in-cluster service account.",
    ),
    "status": ("fleet_operator.cli:status", "Show the RolloutFleets' health: a table, wide, JSON or YAML; --watch."),
}


def command_summary(name: str) -> str:
    """The one-line summary of subcommand ``name``."""
    return _COMMANDS[name][1]


@contextmanager
def _usage_on_one_line() -> Iterator[None]:
    from rollout_runtime.cli.errors import OneLineUsageError, one_line_usage

    try:
        yield
    except OneLineUsageError:
        raise
    except click.UsageError as error:
        raise one_line_usage(error) from None


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use, and the one place errors become one line."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        with _usage_on_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        from rollout_runtime.cli.errors import describe_error

        debug = bool(ctx.params.get("debug"))
        try:
            with _usage_on_one_line():
                return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as error:
            if debug:
                raise
            message = describe_error(error)
            if message is None:
                message = f"unexpected {type(error).__name__}: {error} (rerun with --debug for the traceback)"
            raise click.ClickException(" ".join(message.split())) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        module_name, _, attr = _COMMANDS[cmd_name][0].partition(":")
        command = getattr(importlib.import_module(module_name), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{module_name}:{attr} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_text) for name, (_, help_text) in sorted(_COMMANDS.items())])


@click.group("rollout-fleet", cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rollout-fleet")
@click.option(
    "--debug",
    is_flag=True,
    envvar="ROLLOUT_FLEET_DEBUG",
    help="Show the traceback of an error instead of its one-line message (also ROLLOUT_FLEET_DEBUG=1).",
)
def cli(debug: bool) -> None:
    """rollout-fleet: keep RL rollouts flowing and honest across a fleet of shards."""


def main(*args: Any, **kwargs: Any) -> Any:
    return cli(*args, **kwargs)
