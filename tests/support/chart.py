"""Helpers for the chart, dashboard and alert tests: rendering the chart, reading the rules, naming metrics.

The metric-name helpers are the cross-check between the code and what dashboards/alerts query: the names the
registries the code creates can expose, and the metric names a PromQL expression refers to.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from support.helm import Helm
from support.tools import REPO_ROOT, helm_kube_version

CHART_DIR = REPO_ROOT / "charts" / "rollout-fleet"
RULES_FILE = CHART_DIR / "rules" / "rollout-fleet.rules.yaml"
RULE_TESTS_FILE = REPO_ROOT / "tests" / "rules" / "rollout-fleet.test.yaml"
DASHBOARDS_DIR = CHART_DIR / "dashboards"
OPERATIONS_DOC = REPO_ROOT / "docs" / "operations.md"
KUBE_VERSION = f"{helm_kube_version()}.0"
"""The Kubernetes version rendered manifests are validated against: the one scripts/install-tools.sh stamps into
helm, so `helm template` and `helm lint` assume it without a --kube-version flag."""

# Dashboard template variables and what a test substitutes for them to run a panel query directly.
GRAFANA_VARIABLES = {
    "$__rate_interval": "30s",
    "$namespace": ".*",
    "$fleet": ".*",
    "$job": ".*",
    "$instance": ".*",
}

_METRIC_PREFIXES = ("rollout_", "fleet_", "environment_", "router_")


def package_version() -> str:
    """The Python distribution's version (pyproject.toml): the chart's appVersion must equal it."""
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def render(helm: Helm, *args: str, release: str = "rf", namespace: str = "fleet-system") -> list[dict[str, Any]]:
    """`helm template` the chart with extra arguments (and no --kube-version: helm's own default must do)."""
    out = helm.run("template", release, CHART_DIR, "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The rendered documents of one kind."""
    return [doc for doc in docs if doc["kind"] == kind]


def documented_rbac() -> dict[tuple[str, str], tuple[set[str], str]]:
    """(apiGroup, resource) -> (verbs, scope) from the least-privilege table in docs/operations.md ("RBAC")."""
    table = OPERATIONS_DOC.read_text().split("<!-- rbac-table:", 1)[1].split("\n\n", 1)[0]
    rows: dict[tuple[str, str], tuple[set[str], str]] = {}
    for line in table.splitlines()[3:]:  # the marker comment, the header and the separator
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        group = "" if cells[0] == "(core)" else cells[0]
        rows[(group, cells[1])] = ({verb.strip() for verb in cells[2].split(",")}, cells[3])
    return rows


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation but - and _ dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def operations_anchors() -> set[str]:
    """The anchors of every heading in docs/operations.md (comment lines in fenced code blocks are not headings)."""
    anchors: set[str] = set()
    in_code = False
    for line in OPERATIONS_DOC.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"^#{1,6} (.+)$", line)):
            anchors.add(github_anchor(match.group(1)))
    return anchors


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of the chart's rule file (the single source of the alerts)."""
    source = yaml.safe_load(RULES_FILE.read_text())
    return [rule for group in source["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The panels that show data (rows excluded; panels nested in collapsed rows included)."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def committed_dashboards() -> dict[str, dict[str, Any]]:
    """The dashboard JSON files the chart ships, by file name."""
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS_DIR.glob("*.json"))}


def expand_grafana_variables(expr: str) -> str:
    """A panel query with the dashboard variables replaced, so Prometheus can run it as is."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (ours by prefix, plus `up`), ignoring strings and labels."""
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    without_matchers = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_grouping = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_matchers)
    names = set()
    for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_grouping):
        if token.startswith(_METRIC_PREFIXES) or token == "up":
            names.add(token)
    return names


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry's metric families can expose (counter _total, histogram series, gauges)."""
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count", f"{family.name}_created"}
        else:
            names.add(family.name)
    return names


def registered_metric_names() -> set[str]:
    """The names the code registers: the runtime's, the router's, the environment server's and the operator's."""
    from prometheus_client import CollectorRegistry

    from fleet_operator.metrics import FleetMetrics
    from rollout_runtime.environment.metrics import EnvironmentMetrics
    from rollout_runtime.metrics import RolloutMetrics
    from rollout_runtime.router.metrics import RouterMetrics

    router = CollectorRegistry()
    RouterMetrics(router)
    return (
        exposed_names(router)
        | exposed_names(RolloutMetrics().registry)
        | exposed_names(EnvironmentMetrics().registry)
        | exposed_names(FleetMetrics().registry)
    )


@pytest.fixture(scope="session")
def chart_docs_default(helm: Helm) -> list[dict[str, Any]]:
    """The chart rendered with its default values."""
    return render(helm)


@pytest.fixture(scope="session")
def full_values_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Values that turn every optional part on (HA, namespaced RBAC, monitoring, alerts, dashboards)."""
    values = {
        "replicaCount": 2,
        "image": {"digest": "sha256:" + "a" * 64, "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "operator": {
            "watchNamespaces": ["rl-a", "rl-b"],
            "logLevel": "DEBUG",
            "probe": {"allowedHosts": ["*.gpu.internal", "10.0.0.0/8"], "maxBodyBytes": 16777216},
            "extraEnv": [{"name": "FLEET_OPERATOR_WRITE_RETRY_SECONDS", "value": "5"}],
        },
        "serviceAccount": {"annotations": {"iam.example.org/role": "fleet"}},
        "rbac": {"reader": {"aggregateToView": True}, "registrar": {"create": True}},
        "podLabels": {"team": "rl"},
        "podAnnotations": {"example.org/scrape": "false"},
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "rollout-fleet"}},
            }
        ],
        "metrics": {
            "service": {"annotations": {"example.org/port": "8080"}},
            "serviceMonitor": {
                "enabled": True,
                "additionalLabels": {"release": "kube-prometheus-stack"},
                "metricRelabelings": [{"action": "drop", "regex": "python_gc_.*", "sourceLabels": ["__name__"]}],
            },
            "trainerPodMonitor": {
                "enabled": True,
                "namespaces": ["rl-a"],
                "additionalLabels": {"release": "kube-prometheus-stack"},
            },
        },
        "prometheusRule": {
            "enabled": True,
            "additionalLabels": {"release": "kube-prometheus-stack"},
            "additionalRuleLabels": {"team": "rl-infra"},
            "runbookBaseUrl": "https://docs.example.org/rollout-fleet/operations",
        },
        "dashboards": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "RL"}},
    }
    path = tmp_path_factory.mktemp("chart-values") / "full.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="session")
def chart_docs_full(helm: Helm, full_values_file: Path) -> list[dict[str, Any]]:
    """The chart rendered with every optional part on."""
    return render(helm, "-f", str(full_values_file))
