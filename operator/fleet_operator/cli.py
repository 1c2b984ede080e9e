"""``rollout-fleet crds | operator | status``: the operator's commands (registered lazily in the runtime's CLI).

Heavy imports (kopf, kubernetes_asyncio, rich) happen inside the commands, so ``rollout-fleet crds`` stays cheap.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from rollout_runtime.cli.options import command_help

__all__ = ["crds", "operator", "status"]


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


@click.command(help=command_help("status", "Its shards and environment servers: phase, latency, last error."))
@click.argument("fleet")
@click.option("--namespace", "-n", default=None, help="The fleet's namespace (default: the kubeconfig's).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None)
def status(fleet: str, namespace: str | None, kubeconfig: Path | None) -> None:
    from fleet_operator.status_table import show_fleet_status

    sys.exit(asyncio.run(show_fleet_status(fleet, namespace=namespace, kubeconfig=kubeconfig)))
