"""Grafana dashboards as code: fleet health, rollouts, environment servers; built with grafana-foundation-sdk.

Build-time only, so neither the wheel nor the operator image carries it (nor its SDK): run
``python tools/dashboards.py`` from a checkout with the ``test`` extra installed. The JSON the chart ships
(``charts/rollout-fleet/dashboards/*.json``, loaded into ConfigMaps with ``.Files.Glob``) is this module's output,
committed; a test regenerates it and fails on any difference, so a panel is changed here and never by hand.
Panels query only metrics the code registers (names in docs/metrics.md; a test checks), with template variables
``$datasource``, ``$namespace``/``$fleet`` (operator metrics, and the runtime's: each ``rollout_*`` sample names the
fleet its dispatcher follows) and ``$job``/``$instance`` (runtime and environment-server metrics: labels of the
scrape target). Every dashboard links to the others by their common tag, keeping the time range and variables.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from grafana_foundation_sdk.builders import bargauge, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, units
from grafana_foundation_sdk.models import dashboard as model

__all__ = [
    "DEFAULT_OUTPUT_DIR",
    "dashboard_files",
    "dashboards",
    "environment_servers_dashboard",
    "fleet_health_dashboard",
    "rollouts_dashboard",
    "write_dashboards",
]

DEFAULT_OUTPUT_DIR = Path(__file__).resolve().parent.parent / "charts" / "rollout-fleet" / "dashboards"
_DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
_TAGS = ["rollout-fleet"]
_RATE = "$__rate_interval"
# Operator metrics: filter by the fleet's namespace (and fleet where the metric has that label).
_NS = 'namespace=~"$namespace"'
_FLEET = 'namespace=~"$namespace", fleet=~"$fleet"'
# Environment-server metrics: filter by the server's scrape target.
_RUN = 'job=~"$job", instance=~"$instance"'
# Runtime metrics: by the fleet the dispatcher follows (namespace empty outside Kubernetes) and the trainer's target.
_ROLL = 'namespace=~"$namespace", fleet=~"$fleet", job=~"$job", instance=~"$instance"'
# The series a runtime panel draws: one per trainer process and fleet.
_TRAINER = "namespace, fleet, job, instance"
_TRAINER_LEGEND = "{{fleet}} {{instance}}"


def _query(expr: str, legend: str, ref_id: str) -> prom.Dataquery:
    return prom.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).range()


def _targets(queries: Sequence[tuple[str, str]]) -> list[cogbuilder.Builder[cogvariants.Dataquery]]:
    return [_query(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)]


def _thresholds(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    return (
        dash.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


def _legend() -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["lastNotNull", "max"])
    )


def _timeseries(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    *,
    width: int = 12,
    stacked: bool = False,
    bars: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(_DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .min(0)
        .span(width)
        .height(8)
        .fill_opacity(10)
        .legend(_legend())
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
    return panel


def _variables(*names: tuple[str, str, str]) -> list[Any]:
    """A Prometheus datasource picker, then one multi-select query variable per (name, label, query)."""
    variables: list[Any] = [dash.DatasourceVariable("datasource").label("Data source").type("prometheus")]
    for name, label, query in names:
        variables.append(
            dash.QueryVariable(name)
            .label(label)
            .datasource(_DATASOURCE)
            .query(query)
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    return variables


def _dashboard(uid: str, title: str, description: str, variables: list[Any]) -> dash.Dashboard:
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(_TAGS)
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .variables(variables)
        .link(
            dash.DashboardLink("rollout-fleet dashboards")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags(_TAGS)
            .as_dropdown(True)
            .keep_time(True)
            .include_vars(True)
            .tooltip("The other rollout-fleet dashboards, same time range and variables")
        )
    )


def fleet_health_dashboard() -> dash.Dashboard:
    """Operator view: is each fleet serving, which shards flap, how fast probes answer."""
    board = _dashboard(
        "rollout-fleet-health",
        "rollout-fleet / Fleet health",
        "Health of RolloutFleets as the rollout-fleet operator probes it (fleet_* metrics).",
        _variables(
            ("namespace", "Namespace", "label_values(fleet_shards, namespace)"),
            ("fleet", "Fleet", 'label_values(fleet_shards{namespace=~"$namespace"}, fleet)'),
        ),
    )
    board = board.with_row(dash.Row("Fleets"))
    board = board.with_panel(
        bargauge.Panel()
        .title("Healthy / total shards per fleet")
        .description(
            "Fraction of each fleet's selected shards that are in its healthy set now. Below 1: the fleet is "
            "degraded (alert RolloutFleetDegraded); 0: nothing can serve rollouts (RolloutFleetNoHealthyShards)."
        )
        .datasource(_DATASOURCE)
        .targets(
            _targets(
                [
                    (
                        f"max by (namespace, fleet) (fleet_healthy_shards{{{_FLEET}}})"
                        f" / max by (namespace, fleet) (fleet_shards{{{_FLEET}}})",
                        "{{namespace}}/{{fleet}}",
                    )
                ]
            )
        )
        .unit(units.PercentUnit)
        .min(0)
        .max(1)
        .thresholds(_thresholds((None, "red"), (0.5, "orange"), (1, "green")))
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .orientation(common.VizOrientation.HORIZONTAL)
        .span(8)
        .height(8)
    )
    board = board.with_panel(
        _timeseries(
            "Healthy and total shards",
            "Shards in each fleet's healthy set against the shards it selects. A gap between the lines is capacity "
            "the trainer cannot use.",
            [
                (f"max by (namespace, fleet) (fleet_healthy_shards{{{_FLEET}}})", "{{namespace}}/{{fleet}} healthy"),
                (f"max by (namespace, fleet) (fleet_shards{{{_FLEET}}})", "{{namespace}}/{{fleet}} total"),
            ],
            units.Short,
            width=16,
        )
    )
    board = board.with_row(dash.Row("Shards"))
    board = board.with_panel(
        statetimeline.Panel()
        .title("Shard health timeline")
        .description(
            "One lane per GenerationShard and EnvironmentServer: green while the operator counts it healthy, red "
            "while it does not (Suspect, Unhealthy, Draining, Pending, Stale or Refitting). Flapping lanes are shards "
            "to look at."
        )
        .datasource(_DATASOURCE)
        .targets(
            _targets(
                [(f"max by (namespace, kind, name) (fleet_shard_healthy{{{_NS}}})", "{{kind}} {{namespace}}/{{name}}")]
            )
        )
        .mappings(
            [
                model.ValueMap(
                    options={
                        "0": model.ValueMappingResult(text="not healthy", color="red", index=0),
                        "1": model.ValueMappingResult(text="healthy", color="green", index=1),
                    }
                )
            ]
        )
        .thresholds(_thresholds((None, "red"), (1, "green")))
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .span(24)
        .height(10)
    )
    board = board.with_panel(
        _timeseries(
            "Health transitions",
            "Phase changes per interval, by kind and from -> to phase. Steady state is zero; bursts mean shards "
            "are flapping or a node went away.",
            [
                (
                    f"sum by (kind, from_phase, to_phase) (increase(fleet_health_transitions_total[{_RATE}]))",
                    "{{kind}} {{from_phase}} -> {{to_phase}}",
                )
            ],
            units.Short,
            bars=True,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Status writes",
            "RolloutFleet/shard status writes per second by kind. Writes happen on transitions and coalesced "
            "heartbeats, never per probe: a rate near the probe rate means coalescing broke.",
            [(f"sum by (kind) (rate(fleet_status_writes_total[{_RATE}]))", "{{kind}}")],
            units.OpsPerSecond,
        )
    )
    board = board.with_row(dash.Row("Probes"))
    board = board.with_panel(
        _timeseries(
            "Probe latency",
            "Health-probe round trip by kind (p50, p95, p99). Rising latency precedes probe timeouts and Suspect "
            "shards.",
            [
                (
                    f"histogram_quantile({q}, sum by (le, kind) (rate(fleet_probe_duration_seconds_bucket[{_RATE}])))",
                    f"{{{{kind}}}} p{round(q * 100)}",
                )
                for q in (0.5, 0.95, 0.99)
            ],
            units.Seconds,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Probe failures",
            "Failed health probes per second by kind and reason (timeout, connection, HTTP status, wrong model). "
            "Each failure counts towards the shard's failure threshold.",
            [(f"sum by (kind, reason) (rate(fleet_probe_failures_total[{_RATE}]))", "{{kind}} {{reason}}")],
            units.OpsPerSecond,
            stacked=True,
        )
    )
    return board


def rollouts_dashboard() -> dash.Dashboard:
    """Trainer view: are rollouts committing, what fails and why (INFRA vs DATA), what redispatch costs."""
    board = _dashboard(
        "rollout-fleet-rollouts",
        "rollout-fleet / Rollouts",
        "Rollout dispatch in the trainer (rollout_* metrics of rollout_runtime): outcomes, failure classes, "
        "redispatches, stalls and ejections.",
        _variables(
            ("namespace", "Namespace", "label_values(rollout_attempts_total, namespace)"),
            ("fleet", "Fleet", 'label_values(rollout_attempts_total{namespace=~"$namespace"}, fleet)'),
            ("job", "Job", 'label_values(rollout_attempts_total{namespace=~"$namespace", fleet=~"$fleet"}, job)'),
            (
                "instance",
                "Instance",
                'label_values(rollout_attempts_total{namespace=~"$namespace", fleet=~"$fleet", job=~"$job"}, instance)',
            ),
        ),
    )
    board = board.with_row(dash.Row("Progress"))
    board = board.with_panel(
        stat.Panel()
        .title("Time since last commit")
        .description(
            "Seconds since the trainer last committed a rollout. The stall watchdog acts at its deadline "
            "(default 600 s); alert RolloutStall fires past 900 s with rollouts in flight."
        )
        .datasource(_DATASOURCE)
        .targets(
            _targets(
                [(f"time() - max by ({_TRAINER}) (rollout_last_commit_timestamp_seconds{{{_ROLL}}})", _TRAINER_LEGEND)]
            )
        )
        .unit(units.Seconds)
        .thresholds(_thresholds((None, "green"), (600, "orange"), (900, "red")))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .span(6)
        .height(8)
    )
    board = board.with_panel(
        _timeseries(
            "Rollouts in flight",
            "Attempts running now. In flight with no commits is a stall; in flight near zero with prompts queued "
            "means no healthy shard.",
            [(f"sum by ({_TRAINER}) (rollout_in_flight{{{_ROLL}}})", _TRAINER_LEGEND)],
            units.Short,
            width=9,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Healthy shards seen by the runtime",
            "Shards the runtime may dispatch to: the healthy set it follows minus the shards it ejected itself.",
            [(f"sum by ({_TRAINER}) (rollout_healthy_shards{{{_ROLL}}})", _TRAINER_LEGEND)],
            units.Short,
            width=9,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Prompts by result",
            "Prompts finished per second: completed, data-failed (reported with a reason, never trained on) or "
            "skipped (policy allowed skipping after the infra budget ran out).",
            [(f"sum by (result) (rate(rollout_prompts_total{{{_ROLL}}}[{_RATE}]))", "{{result}}")],
            units.OpsPerSecond,
            stacked=True,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Attempt duration",
            "Attempt latency by outcome (p50, p95). Failed attempts that take as long as successes are timeouts; a "
            "hung shard shows as a p95 at the attempt deadline.",
            [
                (
                    f"histogram_quantile({q}, sum by (le, outcome) "
                    f"(rate(rollout_attempt_duration_seconds_bucket{{{_ROLL}}}[{_RATE}])))",
                    f"{{{{outcome}}}} p{round(q * 100)}",
                )
                for q in (0.5, 0.95)
            ],
            units.Seconds,
        )
    )
    board = board.with_row(dash.Row("Failures"))
    board = board.with_panel(
        _timeseries(
            "Attempts by outcome",
            "Attempts per second by outcome. infra_failure attempts are redispatched; data_failure attempts use "
            "the prompt's small data budget.",
            [(f"sum by (outcome) (rate(rollout_attempts_total{{{_ROLL}}}[{_RATE}]))", "{{outcome}}")],
            units.OpsPerSecond,
            stacked=True,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Failures by class and type",
            "Failed attempts per second by class (infra: the fleet is sick; data: the prompt is bad) and exception "
            "type.",
            [
                (
                    f"sum by (failure_class, failure_type) (rate(rollout_failures_total{{{_ROLL}}}[{_RATE}]))",
                    "{{failure_class}} {{failure_type}}",
                )
            ],
            units.OpsPerSecond,
            stacked=True,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Data-failure rate",
            "Fraction of attempts that failed as DATA. Alert RolloutDataFailureSpike fires above 5% for 5 minutes.",
            [
                (
                    f'sum by ({_TRAINER}) (rate(rollout_attempts_total{{{_ROLL}, outcome="data_failure"}}[{_RATE}]))'
                    f" / sum by ({_TRAINER}) (rate(rollout_attempts_total{{{_ROLL}}}[{_RATE}]))",
                    _TRAINER_LEGEND,
                )
            ],
            units.PercentUnit,
            width=8,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Redispatch rate",
            "Attempts sent to another shard after an infra failure, per second, with runs that exhausted their "
            "redispatch budget (alert RolloutRedispatchExhausted).",
            [
                (
                    f"sum by ({_TRAINER}) (rate(rollout_redispatches_total{{{_ROLL}}}[{_RATE}]))",
                    f"{_TRAINER_LEGEND} redispatched",
                ),
                (
                    f"sum by ({_TRAINER}) (increase(rollout_redispatch_exhausted_total{{{_ROLL}}}[{_RATE}]))",
                    f"{_TRAINER_LEGEND} exhausted",
                ),
            ],
            units.OpsPerSecond,
            width=8,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Stall watchdog",
            "Watchdog firings per interval by action (warn, abort): rollouts were in flight but none committed "
            "within the deadline.",
            [(f"sum by (action) (increase(rollout_stalls_total{{{_ROLL}}}[{_RATE}]))", "{{action}}")],
            units.Short,
            width=8,
            bars=True,
        )
    )
    board = board.with_row(dash.Row("Shards"))
    board = board.with_panel(
        _timeseries(
            "Ejections, holds and quarantines by shard",
            "Passive outlier ejections per interval by shard: an infra failure removed the shard from this "
            "runtime's view until a probe succeeds or the (growing) ejection time passes. Holds: failures past "
            "the ejection cap (max_ejection_percent), after which the shard took no attempt for the backoff. "
            "Quarantines: the shard answered 200 but its outputs (signal) were unlike its same-version peers'.",
            [
                (f"sum by (shard) (increase(rollout_ejections_total{{{_ROLL}}}[{_RATE}]))", "{{shard}} ejected"),
                (f"sum by (shard) (increase(rollout_shard_holds_total{{{_ROLL}}}[{_RATE}]))", "{{shard}} held"),
                (
                    f"sum by (shard, signal) (increase(rollout_shard_quarantines_total{{{_ROLL}}}[{_RATE}]))",
                    "{{shard}} quarantined ({{signal}})",
                ),
            ],
            units.Short,
            width=24,
            bars=True,
        )
    )
    return _router_row(board)


def _router_row(board: dash.Dashboard) -> dash.Dashboard:
    """``rollout-fleet router`` (router_* metrics of its replicas): answers by code, latency, refusals, broken
    streams. Its attempts, ejections and healthy shards are the rollout_* panels above (job = the router's)."""
    board = board.with_row(dash.Row("Router"))
    board = board.with_panel(
        _timeseries(
            "Router answers by code",
            "Requests answered per second by HTTP status. 409: no routable shard (clients stop instead of "
            "retrying); 502/504: every attempt failed; 4xx relayed from a shard: the request's own fault.",
            [(f"sum by (code) (rate(router_requests_total{{{_ROLL}}}[{_RATE}]))", "{{code}}")],
            units.OpsPerSecond,
            width=8,
            stacked=True,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Router latency",
            "Seconds from a request's arrival to the end of its answer (a stream's last byte), p50 and p99.",
            [
                (
                    f"histogram_quantile({q}, sum by (le) "
                    f"(rate(router_request_duration_seconds_bucket{{{_ROLL}}}[{_RATE}])))",
                    f"p{round(q * 100)}",
                )
                for q in (0.5, 0.99)
            ],
            units.Seconds,
            width=8,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Router refusals and broken streams",
            "Requests answered without a shard, by reason (malformed 400, too_large 413, busy 429, "
            "no_healthy_shard 409), and streams a shard broke after their first byte (each ended with an error "
            "event).",
            [
                (f"sum by (reason) (rate(router_refused_total{{{_ROLL}}}[{_RATE}]))", "{{reason}}"),
                (f"sum (rate(router_streams_interrupted_total{{{_ROLL}}}[{_RATE}]))", "streams interrupted"),
            ],
            units.OpsPerSecond,
            width=8,
        )
    )
    return board


def environment_servers_dashboard() -> dash.Dashboard:
    """Environment-server view: episodes by outcome, latency, saturation, cleanup and dependency failures."""
    board = _dashboard(
        "rollout-fleet-environments",
        "rollout-fleet / Environment servers",
        "Environment servers built on rollout_runtime.environment (environment_* metrics): episode outcomes, "
        "latency, admission and the failures that leak resources or come from dependencies.",
        _variables(
            ("job", "Job", "label_values(environment_episodes_total, job)"),
            ("instance", "Instance", 'label_values(environment_episodes_total{job=~"$job"}, instance)'),
        ),
    )
    board = board.with_row(dash.Row("Episodes"))
    board = board.with_panel(
        _timeseries(
            "Episodes by outcome",
            "Episodes finished per second: success, failed (the environment reported a failure), timeout (the "
            "episode deadline passed) and rejected (the admission queue was full or timed out).",
            [(f"sum by (outcome) (rate(environment_episodes_total{{{_RUN}}}[{_RATE}]))", "{{outcome}}")],
            units.OpsPerSecond,
            stacked=True,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Episode duration",
            "Seconds from admission to reply by outcome (p50, p95), parked checkpoint time included. Timeouts "
            "sit at the episode deadline.",
            [
                (
                    f"histogram_quantile({q}, sum by (le, outcome) "
                    f"(rate(environment_episode_duration_seconds_bucket{{{_RUN}}}[{_RATE}])))",
                    f"{{{{outcome}}}} p{round(q * 100)}",
                )
                for q in (0.5, 0.95)
            ],
            units.Seconds,
        )
    )
    board = board.with_row(dash.Row("Saturation and failures"))
    board = board.with_panel(
        _timeseries(
            "In flight and queued",
            "Episodes admitted and running (parked ones included) and episodes waiting for a concurrency slot. "
            "A queue that stays above zero means the server is saturated: add replicas or raise its concurrency.",
            [
                (f"sum by (job, instance) (environment_episodes_in_flight{{{_RUN}}})", "{{instance}} in flight"),
                (f"sum by (job, instance) (environment_admission_queue_depth{{{_RUN}}})", "{{instance}} queued"),
            ],
            units.Short,
            width=8,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Dependency failures",
            "Episodes failed by a call to another server, per second, by whether another attempt may succeed "
            "(retryable: 5xx/408/425/429 and transport errors; the rest are terminal and reported as DATA).",
            [
                (
                    f"sum by (retryable) (rate(environment_dependency_failures_total{{{_RUN}}}[{_RATE}]))",
                    "retryable={{retryable}}",
                )
            ],
            units.OpsPerSecond,
            width=8,
        )
    )
    board = board.with_panel(
        _timeseries(
            "Cleanup failures",
            "Cleanup callbacks that raised or timed out, per interval. Each may have leaked a remote resource "
            "(a sandbox, a container): look at the server's log for the callback.",
            [
                (
                    f"sum by (job, instance) (increase(environment_cleanup_failures_total{{{_RUN}}}[{_RATE}]))",
                    "{{instance}}",
                )
            ],
            units.Short,
            width=8,
            bars=True,
        )
    )
    return board


def _render(board: dash.Dashboard) -> str:
    """Stable JSON: panels numbered in order (Grafana needs unique ids), sorted keys, trailing newline."""
    built = board.build()
    for number, panel in enumerate(built.panels or [], start=1):
        panel.id_val = number
    return json.dumps(built, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def dashboard_files() -> dict[str, str]:
    """File name -> dashboard JSON text, as committed under the chart."""
    boards = {
        "fleet-health.json": fleet_health_dashboard(),
        "rollouts.json": rollouts_dashboard(),
        "environment-servers.json": environment_servers_dashboard(),
    }
    return {name: _render(board) for name, board in boards.items()}


def write_dashboards(output_dir: Path) -> list[Path]:
    """Write every dashboard into ``output_dir``; return the paths written."""
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in dashboard_files().items():
        path = output_dir / name
        path.write_text(text)
        written.append(path)
    return written


@click.command("dashboards")
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUTPUT_DIR,
    show_default=True,
    help="Directory to write the dashboard JSON files into (the chart loads them from there).",
)
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if the files there differ from the generator's output."
)
def dashboards(output_dir: Path, check: bool) -> None:
    """Generate the Grafana dashboards (fleet health, rollouts, environment servers) as JSON."""
    if check:
        stale = [
            name
            for name, text in dashboard_files().items()
            if not (output_dir / name).is_file() or (output_dir / name).read_text() != text
        ]
        if stale:
            raise click.ClickException(
                f"out of date in {output_dir}: {', '.join(stale)} (run `python tools/dashboards.py`)"
            )
        click.echo(f"dashboards in {output_dir} are up to date")
        return
    for path in write_dashboards(output_dir):
        click.echo(f"wrote {path}")


if __name__ == "__main__":
    dashboards()
