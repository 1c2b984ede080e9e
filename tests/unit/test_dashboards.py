"""The Grafana dashboards: generated from code, committed as generated, querying only metrics the code registers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dashboards import DEFAULT_OUTPUT_DIR, dashboard_files, dashboards
from support.chart import (
    DASHBOARDS_DIR,
    committed_dashboards,
    dashboard_panels,
    metric_names,
    registered_metric_names,
)
from support.tools import REPO_ROOT


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard_panels(dashboard) for target in panel["targets"]]


def test_committed_dashboard_json_equals_the_generator_output() -> None:
    generated = dashboard_files()
    committed = {path.name: path.read_text() for path in DASHBOARDS_DIR.glob("*.json")}
    assert sorted(committed) == sorted(generated), "run `python tools/dashboards.py` and commit the result"
    for name, text in generated.items():
        assert committed[name] == text, f"{name} is stale: run `python tools/dashboards.py` and commit the result"


def test_default_output_dir_is_the_charts_dashboards_directory() -> None:
    assert (REPO_ROOT / DEFAULT_OUTPUT_DIR).resolve() == DASHBOARDS_DIR.resolve()


def test_cli_writes_the_dashboards_and_check_flags_a_hand_edit(tmp_path: Path) -> None:
    runner = CliRunner()
    written = runner.invoke(dashboards, ["--output-dir", str(tmp_path)])
    assert written.exit_code == 0, written.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(dashboard_files())
    assert runner.invoke(dashboards, ["--output-dir", str(tmp_path), "--check"]).exit_code == 0

    edited = tmp_path / "rollouts.json"
    edited.write_text(edited.read_text().replace("Rollouts in flight", "Rollouts"))
    stale = runner.invoke(dashboards, ["--output-dir", str(tmp_path), "--check"])
    assert stale.exit_code == 1
    assert "rollouts.json" in stale.output


@pytest.mark.parametrize("name", sorted(committed_dashboards()))
def test_every_panel_queries_prometheus_through_the_datasource_variable(name: str) -> None:
    dashboard = committed_dashboards()[name]
    variables = {var["name"]: var for var in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = list(dashboard_panels(dashboard))
    assert panels
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel.get("description"), f"panel {panel['title']!r} does not say what it shows"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]


@pytest.mark.parametrize("name", sorted(committed_dashboards()))
def test_panel_ids_are_unique_and_panels_fit_the_grid(name: str) -> None:
    dashboard = committed_dashboards()[name]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


@pytest.mark.parametrize("name", sorted(committed_dashboards()))
def test_every_query_uses_only_metric_names_the_code_registers(name: str) -> None:
    registered = registered_metric_names()
    for title, expr in _queries(committed_dashboards()[name]):
        used = metric_names(expr)
        assert used, f"{title!r}: no metric found in {expr!r}"
        assert used <= registered, f"{title!r} queries unregistered {sorted(used - registered)}"


def test_template_variable_queries_use_registered_metrics() -> None:
    registered = registered_metric_names()
    for dashboard in committed_dashboards().values():
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                assert metric_names(variable["query"]) <= registered, variable["query"]


@pytest.mark.parametrize(
    ("name", "required"),
    [
        (
            "fleet-health.json",
            {
                "fleet_healthy_shards",
                "fleet_shards",
                "fleet_shard_healthy",
                "fleet_probe_duration_seconds_bucket",
                "fleet_probe_failures_total",
                "fleet_health_transitions_total",
            },
        ),
        (
            "rollouts.json",
            {
                "rollout_attempts_total",
                "rollout_failures_total",
                "rollout_redispatches_total",
                "rollout_redispatch_exhausted_total",
                "rollout_in_flight",
                "rollout_last_commit_timestamp_seconds",
                "rollout_ejections_total",
                "rollout_prompts_total",
            },
        ),
        (
            "environment-servers.json",
            {
                "environment_episodes_total",
                "environment_episode_duration_seconds_bucket",
                "environment_episodes_in_flight",
                "environment_admission_queue_depth",
                "environment_dependency_failures_total",
                "environment_cleanup_failures_total",
            },
        ),
    ],
)
def test_each_dashboard_covers_its_topics(name: str, required: set[str]) -> None:
    used = set().union(*(metric_names(expr) for _, expr in _queries(committed_dashboards()[name])))
    assert required <= used, f"{name} lacks {sorted(required - used)}"


def test_metric_name_extraction_ignores_labels_strings_and_functions() -> None:
    expr = (
        'sum by (le, fleet_x) (rate(fleet_probe_duration_seconds_bucket{kind="rollout_x"}[5m]))'
        ' / on (job) group_left up{job="fleet_y"}'
    )
    assert metric_names(expr) == {"fleet_probe_duration_seconds_bucket", "up"}


def test_rollouts_dashboard_filters_every_query_by_fleet_and_namespace() -> None:
    """The runtime labels its samples with the fleet it follows: the trainer view is per fleet like the operator's."""
    dashboard = committed_dashboards()["rollouts.json"]
    names = [var["name"] for var in dashboard["templating"]["list"]]
    assert names == ["datasource", "namespace", "fleet", "job", "instance"]
    for title, expr in _queries(dashboard):
        assert 'namespace=~"$namespace"' in expr, title
        assert 'fleet=~"$fleet"' in expr, title


def test_every_dashboard_links_to_the_others_by_their_common_tag() -> None:
    dashboards_by_name = committed_dashboards()
    for name, dashboard in dashboards_by_name.items():
        assert "rollout-fleet" in dashboard["tags"], name
        [link] = dashboard["links"]
        assert (link["type"], link["tags"]) == ("dashboards", ["rollout-fleet"]), name
        assert (link["keepTime"], link["includeVars"]) == (True, True), f"{name}: keep the time range and filters"


@pytest.mark.parametrize("name", sorted(committed_dashboards()))
def test_every_query_uses_only_variables_its_own_dashboard_defines(name: str) -> None:
    """A query naming a variable its dashboard lacks is sent to Prometheus with the literal ``$name`` in it."""
    dashboard = committed_dashboards()[name]
    defined = {variable["name"] for variable in dashboard["templating"]["list"]}
    for title, expr in _queries(dashboard):
        used = set(re.findall(r"\$(\w+)", expr)) - {"__rate_interval", "__interval", "__range"}
        assert used <= defined, f"{title!r} uses undefined {sorted(used - defined)}"
