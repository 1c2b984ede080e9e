"""``rollout-fleet crds | operator | status``: the operator's commands (registered lazily in the runtime's CLI).

Heavy imports (kopf, kubernetes_asyncio, rich) happen inside the commands, so ``rollout-fleet crds`` stays cheap.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rollout_runtime.cli.options import command_help

if TYPE_CHECKING:
    from fleet_operator.status_reader import FleetQuery

__all__ = ["OUTPUTS", "crds", "operator", "status"]

OUTPUTS = ("table", "wide", "json", "yaml")
"""``status -o``: kubectl's names; :func:`fleet_operator.status_table.render` renders each."""


@click.command(help=command_help("crds"))
@click.option(
    "--output-dir",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write one YAML file per CRD into this directory (e.g. crds/) instead of printing them.",
)
@click.option("--check", is_flag=True, help="Exit 1 if the files in --output-dir differ from the generated ones.")
def crds(output_dir: Path | None, check: bool) -> None:
    from fleet_operator.crds import crd_files, generate_crds, write_crds

    generated = generate_crds()
    if output_dir is None:
        if check:
            raise click.UsageError("--check needs --output-dir")
        click.echo("---\n".join(generated.values()), nl=False)
        return
    if check:
        stale = sorted(set(generated.items()) ^ set(crd_files(output_dir).items()))
        if stale:
            names = sorted({name for name, _ in stale})
            click.echo(f"CRDs in {output_dir} are stale: {', '.join(names)}; run `rollout-fleet crds -o {output_dir}`")
            sys.exit(1)
        click.echo(f"CRDs in {output_dir} are up to date")
        return
    for path in write_crds(output_dir):
        click.echo(f"wrote {path}")


@click.command(
    help=command_help(
        "operator", "Configuration comes from FLEET_OPERATOR_* environment variables (see fleet_operator.settings)."
    )
)
@click.option("--namespace", "-n", "namespaces", multiple=True, help="Watch only these namespaces (repeatable).")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
def operator(namespaces: tuple[str, ...], verbose: bool) -> None:
    from fleet_operator.runner import run_operator
    from fleet_operator.settings import InvalidSettings, load_settings

    try:
        settings = load_settings()
    except InvalidSettings as error:
        raise click.ClickException(str(error)) from None  # one line on stderr, exit 1
    if namespaces:
        settings = settings.model_copy(update={"namespaces": list(namespaces)})
    if verbose:
        settings = settings.model_copy(update={"log_level": "DEBUG"})
    sys.exit(asyncio.run(run_operator(settings)))


@click.command(
    help=command_help(
        "status",
        "With FLEET: that fleet's shards and environment servers (phase, latency, last error); without: every fleet "
        "in the namespace (or all namespaces with -A). Each read is bounded by --timeout.",
    )
)
@click.argument("fleet", required=False)
@click.option("--namespace", "-n", default=None, help="The fleets' namespace (default: the kubeconfig's).")
@click.option("--all-namespaces", "-A", is_flag=True, help="List the fleets of every namespace.")
@click.option(
    "--output",
    "-o",
    type=click.Choice(OUTPUTS),
    default="table",
    show_default=True,
    help="table, wide (more columns), or a json/yaml document (one fleet, or {items: [...]}).",
)
@click.option("--watch", "-w", is_flag=True, help="Keep running; show the fleets again each time they change.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between reads (--watch).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds each read of the API server may take before status gives up.",
)
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--max-updates", type=click.IntRange(min=1), default=None, hidden=True, help="Stop a watch after N.")
def status(
    fleet: str | None,
    namespace: str | None,
    all_namespaces: bool,
    output: str,
    watch: bool,
    interval: float,
    timeout: float,
    kubeconfig: Path | None,
    max_updates: int | None,
) -> None:
    if fleet is not None and all_namespaces:
        raise click.UsageError("a FLEET name needs one namespace: drop -A/--all-namespaces or the name")
    from fleet_operator.status_reader import FleetQuery

    query = FleetQuery(name=fleet, namespace=namespace, all_namespaces=all_namespaces)
    shown = _show_status(
        query, output, kubeconfig=kubeconfig, read_timeout=timeout, watch=watch, interval=interval,
        max_updates=max_updates,
    )  # fmt: skip
    try:
        asyncio.run(shown)
    except KeyboardInterrupt:
        if not watch:
            raise
        # Ctrl-C is how a watch ends: exit 0, no "Aborted!"


async def _show_status(
    query: FleetQuery, output: str, *, kubeconfig: Path | None, read_timeout: float, watch: bool, interval: float,
    max_updates: int | None,
) -> None:  # fmt: skip
    from rich.console import Console

    from fleet_operator.status_reader import open_reader, watch_changes
    from fleet_operator.status_table import render

    console = Console()

    def show(summaries: list[dict[str, Any]], *, again: bool) -> None:
        shown = render(summaries, output, named=query.name is not None, all_namespaces=query.all_namespaces,
                       namespace=reader.namespace)  # fmt: skip
        if isinstance(shown, str):  # a document: exactly as rendered, no markup, no wrapping
            click.echo(f"---\n{shown}" if again and output == "yaml" else shown)
        else:
            if again and console.is_terminal:
                console.clear()
            console.print(shown)

    async with open_reader(query, kubeconfig=kubeconfig, read_timeout=read_timeout) as reader:
        if not watch:
            show(await reader.read(), again=False)
            return
        shown_once = False
        async for summaries in watch_changes(
            reader, interval=interval, max_updates=max_updates, warn=lambda m: click.echo(f"warning: {m}", err=True)
        ):
            show(summaries, again=shown_once)
            shown_once = True
