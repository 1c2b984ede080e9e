"""``rollout-fleet demo``: the local demo fleet with a live view, /metrics, a summary table and a JSON report."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import click
from prometheus_client import CollectorRegistry, start_http_server
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollout_runtime.cli.options import PORT_NUMBER, command_help, config_from_options
from rollout_runtime.demo import DemoConfig, DemoReport, DemoView, run_demo
from rollout_runtime.demo_shards import ShardEngine
from rollout_runtime.health import HealthPhase
from rollout_runtime.vllm.tool import VllmMissing, VllmTool

_PHASE_STYLE = {
    HealthPhase.HEALTHY: "green",
    HealthPhase.SUSPECT: "yellow",
    HealthPhase.UNHEALTHY: "red",
    HealthPhase.PENDING: "dim",
    HealthPhase.DRAINING: "blue",
    HealthPhase.STALE: "magenta",
    HealthPhase.REFITTING: "cyan",
}


SIM_SHARDS = 5
VLLM_SERVERS = 3
"""Three tiny-model vLLM servers fit beside the batch on two cores (each ~2-3 GB of memory)."""


def parse_shards(ctx: click.Context, param: click.Parameter, value: str) -> tuple[ShardEngine, int]:
    """``--shards``: ``N`` simulated shards, or ``vllm`` / ``vllm:N`` real vLLM servers."""
    text = value.strip()
    engine, _, count = ("sim", "", text) if text.isdigit() else text.partition(":")
    if engine not in {e.value for e in ShardEngine} or (count and not count.isdigit()):
        raise click.BadParameter(f"{text!r} is not a count of simulated shards (5), vllm or vllm:N", ctx, param)
    default = VLLM_SERVERS if engine == ShardEngine.VLLM.value else SIM_SHARDS
    return ShardEngine(engine), int(count) if count else default


@click.command(
    help=command_help(
        "demo",
        "A batch runs through simulated shards (or real vLLM servers: --shards vllm) while chaos hits them; no "
        "Kubernetes needed.",
    )
)
@click.option(
    "--shards",
    default=str(SIM_SHARDS),
    callback=parse_shards,
    show_default=True,
    help="N simulated shards, or vllm[:N] real vLLM servers (default 3; `bash scripts/install-tools.sh vllm`).",
)
@click.option("--prompts", default=1000, show_default=True, help="Prompts in the batch.")
@click.option("--over-long", default=5, show_default=True, help="Prompts longer than max_model_len (data failures).")
@click.option("--chaos/--no-chaos", default=True, show_default=True, help="Kill, hang, flap and burst shards.")
@click.option("--env/--no-env", "environment", default=True, show_default=True, help="Score on an environment server.")
@click.option("--concurrency", default=16, show_default=True, help="Rollouts in flight at once.")
@click.option("--seed", default=0, show_default=True, help="Seed for prompts and jitter.")
@click.option(
    "--metrics-port",
    type=PORT_NUMBER,
    default=9464,
    show_default=True,
    help="Serve /metrics here while running (0: any).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address /metrics binds to.")
@click.option(
    "--linger",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Keep serving /metrics this many seconds after the run.",
)
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports/demo"),
    show_default=True,
    help="Where report.json and the failure ledger (failures.jsonl) go.",
)
def demo(
    shards: tuple[ShardEngine, int],
    prompts: int,
    over_long: int,
    chaos: bool,
    environment: bool,
    concurrency: int,
    seed: int,
    metrics_port: int,
    metrics_host: str,
    linger: float,
    report_dir: Path,
) -> None:
    config = config_from_options(  # DemoConfig's fields hold the bounds; a value out of them is a usage error
        DemoConfig,
        renamed={"over_long_prompts": "--over-long"},
        shards=shards[1],
        engine=shards[0],
        prompts=prompts,
        over_long_prompts=over_long,
        chaos=chaos,
        environment=environment,
        concurrency=concurrency,
        seed=seed,
        report_dir=report_dir,
    )
    console = Console()
    registry = CollectorRegistry()
    if config.engine is ShardEngine.VLLM:
        try:
            VllmTool.from_env().require()
        except VllmMissing as exc:
            raise click.ClickException(str(exc)) from None
    try:
        server, _ = start_http_server(metrics_port, addr=metrics_host, registry=registry)
    except OSError as exc:  # the port is taken or the address is not ours: the world, not the command line
        raise click.ClickException(
            f"cannot serve /metrics on {metrics_host}:{metrics_port}: {exc} (try --metrics-port 0)"
        ) from None
    console.print(
        f"[bold]rollout-fleet demo[/]: {shards[1]} {'vLLM servers' if shards[0] is ShardEngine.VLLM else 'shards'}, "
        f"{prompts} prompts, chaos {'on' if chaos else 'off'}; "
        f"metrics at http://{metrics_host}:{server.server_port}/metrics"
    )
    try:
        report = asyncio.run(_run(config, registry, console))
        _summary(console, report)
        console.print(f"report: {report_dir / 'report.json'}   failure ledger: {report.ledger_path}")
        if linger > 0:
            console.print(f"serving /metrics for {linger:.0f} more seconds")
            time.sleep(linger)
    finally:
        server.shutdown()
    if report.error or not report.invariant_holds:
        sys.exit(1)


async def _run(config: DemoConfig, registry: CollectorRegistry, console: Console) -> DemoReport:
    view = DemoView(config.prompts)
    progress = Progress(
        TextColumn("[bold]rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("rollouts", total=config.prompts, detail="")

    def render() -> Group:
        return Group(progress, _fleet_table(view), "\n".join(view.events))

    with Live(render(), console=console, refresh_per_second=8, transient=not console.is_terminal) as live:

        def tick(v: DemoView) -> None:
            stats = v.stats
            detail = f"data-failed {v.data_failed}  redispatches {stats.redispatches if stats else 0}"
            progress.update(task, completed=v.finished, detail=detail)
            live.update(render())

        report = await run_demo(config, registry=registry, view=view, on_tick=tick)
        live.update(render())
    return report


def _fleet_table(view: DemoView) -> Table:
    table = Table(box=None, pad_edge=False, show_header=True, header_style="dim")
    table.add_column("shard")
    table.add_column("health")
    table.add_column("routable")
    for name, phase in view.phases.items():
        routable = "ejected" if name in view.ejected else ("yes" if name in view.routable else "no")
        table.add_row(name, f"[{_PHASE_STYLE.get(phase, '')}]{phase.value}[/]", routable)
    return table


def _summary(console: Console, report: DemoReport) -> None:
    stats = report.stats
    if not console.is_terminal:  # the live view was not shown: say what happened
        console.print("\n".join(report.timeline))
    table = Table(title="demo summary", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="right")
    rows = [
        ("prompts", stats.get("submitted", 0)),
        ("completed", stats.get("completed", 0)),
        ("data-failed (reported, never trained on)", stats.get("data_failed", 0)),
        ("skipped", stats.get("skipped", 0)),
        ("lost", stats.get("submitted", 0) - stats.get("completed", 0) - stats.get("data_failed", 0)
         - stats.get("skipped", 0) - stats.get("aborted", 0)),
        ("attempts", stats.get("attempts", 0)),
        ("redispatches", stats.get("redispatches", 0)),
        ("attempts cancelled on unhealthy shards", stats.get("cancelled", 0)),
        ("ejections", stats.get("ejections", 0)),
        ("stalls", stats.get("stalls", 0)),
        ("answers not committed (stale weights)", stats.get("stale", 0)),
        ("weights: policy version", report.weights.get("policy_version", "-")),
        ("weights: committed by version", ", ".join(f"v{v}: {n}" for v, n in
                                                    report.weights.get("committed_by_version", {}).items()) or "-"),
        ("weights: stale results committed (must be 0)", report.weights.get("stale_committed", 0)),
        ("weights: refits of restarted shards", report.weights.get("refits", 0)),
        ("mean reward", f"{report.mean_reward:.3f}" if report.mean_reward is not None else "-"),
        ("wall time", f"{report.wall_seconds:.1f} s"),
    ]  # fmt: skip
    for label, value in rows:
        table.add_row(label, str(value))
    console.print(table)
    if report.data_failures:
        reasons = Table(title="data failures (from the failure ledger)")
        reasons.add_column("prompt")
        reasons.add_column("type")
        reasons.add_column("reason", overflow="fold")
        for entry in report.data_failures[:10]:
            reason = entry["reason"].removeprefix(f"{entry['failure_type']}: ")
            reasons.add_row(str(entry["prompt_id"]), entry["failure_type"], reason[:200])
        console.print(reasons)
    verdict = "[green]holds[/]" if report.invariant_holds else "[red]VIOLATED[/]"
    console.print(f"accounting invariant (every prompt ends exactly once): {verdict}")
    if report.weights.get("stale_committed"):
        console.print(f"[red]{report.weights['stale_committed']} results from stale weights were committed[/]")
    if report.error:
        console.print(f"[red]run ended with {report.error}[/]")
