"""The Helm chart, rendered offline: lint, schema, strict Kubernetes validation, RBAC, hardening, monitoring objects.

Rendered with the real helm for the default values and for values that turn every optional part on. Kubernetes
objects are validated against the Kubernetes 1.35 OpenAPI schemas in strict mode (unknown fields fail); the
Prometheus Operator's kinds are not in those schemas, so their shape is checked here against the fields of
monitoring.coreos.com/v1 the chart uses, and the PrometheusRule's rules go through promtool.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from fleet_operator.settings import OperatorSettings
from support.chart import (
    CHART_DIR,
    KUBE_VERSION,
    RULES_FILE,
    alert_rules,
    by_kind,
    committed_dashboards,
    documented_rbac,
    operations_anchors,
    package_version,
    render,
)
from support.helm import Helm
from support.prometheus import Promtool

MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

# --- the documented least-privilege set --------------------------------------------------------------------------


def rules_as_table(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """RBAC rules flattened to (apiGroup, resource) -> verbs."""
    table: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert not rule.get("resourceNames"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                table.setdefault((group, resource), set()).update(rule["verbs"])
    return table


# --- lint, versions, schema ---------------------------------------------------------------------------------------


def test_chart_lints_strictly_with_default_and_full_values(helm: Helm, full_values_file: Path) -> None:
    for extra in ([], ["-f", str(full_values_file)]):
        result = helm.run("lint", "--strict", CHART_DIR, *extra)
        assert "0 chart(s) failed" in result.stdout


def test_helm_template_works_with_no_flags(helm: Helm) -> None:
    """The project's helm assumes the Kubernetes version it is stamped with, which meets the chart's kubeVersion."""
    result = helm.run("template", "rf", CHART_DIR)
    kinds = {doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc}
    assert {"Deployment", "ServiceAccount", "ClusterRole"} <= kinds


def test_chart_still_refuses_a_kubernetes_older_than_its_kube_version(helm: Helm) -> None:
    result = helm.run("template", "rf", CHART_DIR, "--kube-version", "1.28.0", check=False)
    assert result.returncode != 0
    assert "chart requires kubeVersion: >=1.29.0-0" in result.stderr


def test_chart_app_version_and_version_equal_the_package_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["appVersion"] == package_version()
    assert chart["version"] == package_version()


def test_default_image_tag_is_the_app_version(chart_docs_default: list[dict[str, Any]]) -> None:
    (deployment,) = by_kind(chart_docs_default, "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/rollout-fleet/rollout-fleet-operator:{package_version()}"


def test_digest_pins_the_image_and_pull_policy_is_configurable(chart_docs_full: list[dict[str, Any]]) -> None:
    (deployment,) = by_kind(chart_docs_full, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/rollout-fleet/rollout-fleet-operator@sha256:" + "a" * 64
    assert container["imagePullPolicy"] == "Always"


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        (["--set", "replicas=2"], "replicas"),  # unknown top-level key (the real one is replicaCount)
        (["--set", "operator.probe.allowedHost[0]=x"], "allowedHost"),  # unknown nested key (typo)
        (["--set", "replicaCount=two"], "replicaCount"),
        (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        (["--set", "operator.logLevel=TRACE"], "logLevel"),
        (["--set", "operator.httpPort=70000"], "httpPort"),
        (["--set-string", "metrics.serviceMonitor.enabled=yes"], "enabled"),
        (["--set", "prometheusRule.disabledAlerts[0]=NoSuchAlert"], "disabledAlerts"),
        (["--set", "image.digest=latest"], "digest"),
        (["--set", "metrics.serviceMonitor.interval=30 seconds"], "interval"),
        (["--set", "operator.watchNamespaces[0]=Not_A_Namespace"], "watchNamespaces"),
    ],
)
def test_values_schema_rejects_bad_values(helm: Helm, override: list[str], complaint: str) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failure:
        render(helm, *override)
    assert "values don't meet the specifications of the schema" in failure.value.stderr
    assert complaint in failure.value.stderr


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        (["--set", "replicaCount=2", "--set", "operator.leaderElection.enabled=false"], "leaderElection"),
        (["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true"], "at most one"),
    ],
)
def test_contradictory_values_fail_with_the_reason(helm: Helm, override: list[str], complaint: str) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failure:
        render(helm, *override)
    assert complaint in failure.value.stderr


@pytest.mark.parametrize(
    ("override", "where", "what"),
    [
        # Schema patterns: the error names the key, the value and the form it must have.
        (["--set", "resources.limits.memory=lots"], "at '/resources/limits/memory': 'lots'", "(m|k|M|G|T|P|E|Ki|Mi|Gi"),
        (["--set", "resources.requests.cpu=1GB"], "at '/resources/requests/cpu': '1GB'", "does not match pattern"),
        (["--set", "resources.requests.cpu=-1"], "at '/resources/requests/cpu'", "minimum: got -1, want 0"),
        (
            ["--set", "operator.probe.allowedHosts[0]=http://bad host"],
            "at '/operator/probe/allowedHosts/0': 'http://bad host'",
            "[a-zA-Z0-9*?_.-]+|[0-9a-fA-F:.]+/[0-9]+",
        ),
        (
            ["--set", "operator.probe.allowedHosts[0]=vllm.rl.example.org:8000"],
            "at '/operator/probe/allowedHosts/0'",
            "does not match pattern",
        ),
        # Rules the schema cannot state: a sentence from the template saying what to change.
        (
            ["--set", "operator.leaderElection.renewSeconds=15"],
            "operator.leaderElection.renewSeconds (15) must be less than operator.leaderElection.leaseDurationSeconds",
            "lower renewSeconds",
        ),
        (
            ["--set", "operator.leaderElection.leaseDurationSeconds=3"],
            "renewSeconds (5) must be less than operator.leaderElection.leaseDurationSeconds (3)",
            "or raise leaseDurationSeconds",
        ),
        (
            ["--set", "operator.probe.allowedHosts[0]=10.0.0.0/33"],
            'operator.probe.allowedHosts: "10.0.0.0/33" is not a CIDR block',
            "prefix length of 0-32",
        ),
        (
            ["--set", "operator.probe.allowedHosts[0]=300.1.2.3/8"],
            '"300.1.2.3/8" is not a CIDR block',
            "(10.0.0.0/8)",
        ),
    ],
)
def test_values_the_operator_would_refuse_fail_the_install_saying_what_to_fix(
    helm: Helm, override: list[str], where: str, what: str
) -> None:
    result = helm.run("template", "rf", CHART_DIR, *override, check=False)
    assert result.returncode != 0
    assert where in result.stderr
    assert what in result.stderr


@pytest.mark.parametrize(
    "values",
    [
        {"operator": {"probe": {"allowedHosts": ["*.gpu.internal", "vllm-?.rl.example.org", "10.0.0.0/8"]}}},
        {"operator": {"probe": {"allowedHosts": ["fd00::/8", "192.168.1.7/32", "gpu_node.internal"]}}},
        {"operator": {"leaderElection": {"leaseDurationSeconds": 5.5, "renewSeconds": 5}}},
        {"operator": {"leaderElection": {"leaseDurationSeconds": 600, "renewSeconds": 0.5}}},
        {"resources": {"requests": {"cpu": 0.25, "memory": "1Gi"}, "limits": {"cpu": "1500m", "memory": "2e9"}}},
    ],
)
def test_values_the_chart_accepts_are_settings_the_operator_accepts(
    helm: Helm, values: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    (deployment,) = by_kind(render(helm, "-f", str(values_file)), "Deployment")
    for var in deployment["spec"]["template"]["spec"]["containers"][0]["env"]:
        monkeypatch.setenv(var["name"], var.get("value", "from-downward-api"))
    OperatorSettings()  # raises if the operator would refuse to start


def test_values_yaml_documents_every_key() -> None:
    """Every key has a comment on the line above it, or sits inside a block whose key has one."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    documented_indents: list[tuple[int, bool]] = []  # stack of (indent, documented) for enclosing keys
    undocumented = []
    for index, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w-]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while documented_indents and documented_indents[-1][0] >= indent:
            documented_indents.pop()
        previous = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        has_comment = previous.startswith("#")
        inherited = any(documented for _, documented in documented_indents)
        if not has_comment and not inherited and not line.rstrip().endswith(":"):
            undocumented.append(line.strip())
        documented_indents.append((indent, has_comment or inherited))
    assert not undocumented, f"values.yaml keys without a comment: {undocumented}"


# --- strict Kubernetes validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "full"])
def test_every_rendered_manifest_passes_strict_kubernetes_validation(
    variant: str, chart_docs_default: list[dict[str, Any]], chart_docs_full: list[dict[str, Any]]
) -> None:
    docs = chart_docs_default if variant == "default" else chart_docs_full
    validated = set()
    for doc in docs:
        if doc["kind"] in MONITORING_KINDS:
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        validated.add(doc["kind"])
    expected = {"Deployment", "ServiceAccount", "Service", "PodDisruptionBudget", "ClusterRole"}
    assert expected <= validated
    if variant == "full":
        assert {"Role", "RoleBinding", "ConfigMap"} <= validated


_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {
            "enum": [
                "replace",
                "keep",
                "drop",
                "hashmod",
                "labelmap",
                "labeldrop",
                "labelkeep",
                "lowercase",
                "uppercase",
                "keepequal",
                "dropequal",
            ]
        },
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
    },
}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string", "pattern": "^/"},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "honorLabels": {"type": "boolean"},
        "relabelings": {"type": "array", "items": _RELABEL},
        "metricRelabelings": {"type": "array", "items": _RELABEL},
    },
}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": _LABELS, "matchExpressions": {"type": "array", "items": {"type": "object"}}},
}
_NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}},
}
_METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _LABELS},
}


def _monitor_schema(kind: str, endpoints_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", endpoints_key],
                "properties": {
                    "selector": _SELECTOR,
                    "namespaceSelector": _NAMESPACE_SELECTOR,
                    endpoints_key: {"type": "array", "minItems": 1, "items": _ENDPOINT},
                },
            },
        },
    }


_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["alert", "expr"],
    "properties": {
        "alert": {"type": "string"},
        "expr": {"type": "string"},
        "for": _DURATION,
        "labels": _LABELS,
        "annotations": _LABELS,
    },
}
MONITORING_SCHEMAS = {
    "ServiceMonitor": _monitor_schema("ServiceMonitor", "endpoints"),
    "PodMonitor": _monitor_schema("PodMonitor", "podMetricsEndpoints"),
    "PrometheusRule": {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "groups": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["name", "rules"],
                            "properties": {"name": {"type": "string"}, "rules": {"type": "array", "items": _RULE}},
                        },
                    }
                },
            },
        },
    },
}


def test_monitoring_objects_have_the_prometheus_operator_shape(chart_docs_full: list[dict[str, Any]]) -> None:
    found = [doc for doc in chart_docs_full if doc["kind"] in MONITORING_KINDS]
    assert sorted(doc["kind"] for doc in found) == ["PodMonitor", "PrometheusRule", "ServiceMonitor"]
    for doc in found:
        jsonschema.validate(doc, MONITORING_SCHEMAS[doc["kind"]])
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_monitoring_objects_are_off_by_default(chart_docs_default: list[dict[str, Any]]) -> None:
    assert not [doc for doc in chart_docs_default if doc["kind"] in MONITORING_KINDS | {"ConfigMap"}]


def test_service_monitor_keeps_fleet_namespace_labels_and_names_the_job_the_alerts_use(
    chart_docs_full: list[dict[str, Any]],
) -> None:
    (monitor,) = by_kind(chart_docs_full, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert {"targetLabel": "job", "replacement": "rollout-fleet-operator"} in endpoint["relabelings"]
    alerts = RULES_FILE.read_text()
    assert 'job="rollout-fleet-operator"' in alerts
    (service,) = by_kind(chart_docs_full, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}


def test_prometheus_rule_embeds_the_rule_file_with_release_labels_and_runbook_urls(
    chart_docs_full: list[dict[str, Any]], promtool: Promtool, tmp_path: Path
) -> None:
    (rule,) = by_kind(chart_docs_full, "PrometheusRule")
    source = yaml.safe_load(RULES_FILE.read_text())
    rendered = rule["spec"]["groups"]
    assert [g["name"] for g in rendered] == [g["name"] for g in source["groups"]]
    for rendered_group, source_group in zip(rendered, source["groups"], strict=True):
        for got, want in zip(rendered_group["rules"], source_group["rules"], strict=True):
            assert got["expr"] == want["expr"]
            assert got.get("for") == want.get("for")
            assert got["labels"] == {**want["labels"], "team": "rl-infra"}
            anchor = want["alert"].lower()
            assert got["annotations"] == {
                **want["annotations"],
                "runbook_url": f"https://docs.example.org/rollout-fleet/operations#{anchor}",
            }
    # What the Prometheus Operator hands to Prometheus is a rule file with these groups: promtool must accept it.
    rendered_file = tmp_path / "rendered.rules.yaml"
    rendered_file.write_text(yaml.safe_dump({"groups": rendered}))
    promtool.check_rules(rendered_file)


def test_every_alert_links_a_runbook_section_of_operations_md_by_default(helm: Helm) -> None:
    (rule,) = by_kind(render(helm, "--set", "prometheusRule.enabled=true"), "PrometheusRule")
    rendered = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert [r["alert"] for r in rendered] == [r["alert"] for r in alert_rules()]
    base = f"https://github.com/rollout-fleet/rollout-fleet/blob/v{package_version()}/docs/operations.md#"
    anchors = operations_anchors()
    for alert in rendered:
        url = alert["annotations"]["runbook_url"]
        assert url.startswith(base), url
        assert url.removeprefix(base) in anchors, f"{alert['alert']}: no heading of docs/operations.md has #{url}"
        # The description's plain-text pointer (for those reading the rule file without the chart) resolves too.
        text_anchor = re.search(r"docs/operations\.md#([\w-]+)", alert["annotations"]["description"])
        assert text_anchor is not None
        assert text_anchor.group(1) in anchors


def test_disabled_alerts_are_left_out(helm: Helm) -> None:
    docs = render(
        helm, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.disabledAlerts[0]=RolloutFleetDegraded"
    )
    (rule,) = by_kind(docs, "PrometheusRule")
    names = {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]}
    assert "RolloutFleetDegraded" not in names
    assert "RolloutFleetNoHealthyShards" in names


def test_dashboard_configmaps_carry_the_generated_json_for_the_sidecar(chart_docs_full: list[dict[str, Any]]) -> None:
    configmaps = by_kind(chart_docs_full, "ConfigMap")
    shipped = {}
    for configmap in configmaps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["namespace"] == "monitoring"
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "RL"}
        shipped.update(configmap["data"])
    committed = committed_dashboards()
    assert sorted(shipped) == sorted(committed)
    for name, text in shipped.items():
        assert yaml.safe_load(text) == committed[name]


# --- the operator Deployment --------------------------------------------------------------------------------------


def test_operator_env_vars_are_settings_the_operator_reads(chart_docs_full: list[dict[str, Any]]) -> None:
    (deployment,) = by_kind(chart_docs_full, "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [var["name"] for var in env]
    assert len(names) == len(set(names))
    fields = {f"FLEET_OPERATOR_{field.upper()}" for field in OperatorSettings.model_fields}
    ours = {name for name in names if name.startswith("FLEET_OPERATOR_")}
    assert ours <= fields, f"not OperatorSettings fields: {sorted(ours - fields)}"
    plain = {var["name"]: var["value"] for var in env if "value" in var}
    assert plain["FLEET_OPERATOR_PROBE_ALLOWED_HOSTS"] == '["*.gpu.internal","10.0.0.0/8"]'
    assert plain["FLEET_OPERATOR_NAMESPACES"] == '["rl-a","rl-b"]'
    assert plain["FLEET_OPERATOR_PROBE_MAX_BODY_BYTES"] == "16777216"


def test_operator_settings_parse_the_rendered_environment(
    chart_docs_full: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator accepts exactly what the chart renders (values typed by the schema, strings by Kubernetes)."""
    (deployment,) = by_kind(chart_docs_full, "Deployment")
    for var in deployment["spec"]["template"]["spec"]["containers"][0]["env"]:
        monkeypatch.setenv(var["name"], var.get("value", "from-downward-api"))
    settings = OperatorSettings()
    assert settings.namespaces == ["rl-a", "rl-b"]
    assert settings.probe_allowed_hosts == ["*.gpu.internal", "10.0.0.0/8"]
    assert settings.leader_election is True
    assert settings.lease_namespace == "fleet-system"
    assert settings.lease_name == "rf-rollout-fleet"
    assert settings.identity == "from-downward-api"
    assert settings.http_port == 8080
    assert settings.log_level == "DEBUG"


def test_operator_pod_is_hardened(chart_docs_default: list[dict[str, Any]]) -> None:
    (deployment,) = by_kind(chart_docs_default, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsNonRoot"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["terminationGracePeriodSeconds"] > 20  # above operator.shutdownTimeoutSeconds


def test_ha_mode_rolls_with_a_standby_and_single_mode_never_runs_two(helm: Helm) -> None:
    (ha,) = by_kind(render(helm, "--set", "replicaCount=2"), "Deployment")
    assert ha["spec"]["replicas"] == 2
    assert ha["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    (single,) = by_kind(render(helm, "--set", "operator.leaderElection.enabled=false"), "Deployment")
    assert single["spec"]["strategy"] == {"type": "Recreate"}


def test_pod_disruption_budget_selects_the_operator_pods(chart_docs_default: list[dict[str, Any]]) -> None:
    (pdb,) = by_kind(chart_docs_default, "PodDisruptionBudget")
    (deployment,) = by_kind(chart_docs_default, "Deployment")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


# --- RBAC ---------------------------------------------------------------------------------------------------------


def test_cluster_wide_rbac_is_exactly_the_documented_set(chart_docs_default: list[dict[str, Any]]) -> None:
    documented = documented_rbac()
    operator_roles = [
        r for r in by_kind(chart_docs_default, "ClusterRole") if r["metadata"]["name"] == "rf-rollout-fleet"
    ]
    (cluster_role,) = operator_roles
    want_cluster = {key: verbs for key, (verbs, scope) in documented.items() if scope == "watched namespaces"}
    assert rules_as_table(cluster_role["rules"]) == want_cluster
    (lease_role,) = by_kind(chart_docs_default, "Role")
    assert lease_role["metadata"]["namespace"] == "fleet-system"
    want_lease = {key: verbs for key, (verbs, scope) in documented.items() if scope == "release namespace"}
    assert rules_as_table(lease_role["rules"]) == want_lease
    (binding,) = by_kind(chart_docs_default, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rf-rollout-fleet", "namespace": "fleet-system"}]


def test_namespaced_mode_grants_roles_in_watched_namespaces_only(chart_docs_full: list[dict[str, Any]]) -> None:
    documented = documented_rbac()
    names = {r["metadata"]["name"] for r in by_kind(chart_docs_full, "ClusterRole")}
    assert names == {"rollout-fleet-reader", "rollout-fleet-registrar"}, (
        "namespaced mode must not create a cluster-wide operator role"
    )
    assert not by_kind(chart_docs_full, "ClusterRoleBinding")
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(chart_docs_full, "Role")}
    want = {key: verbs for key, (verbs, scope) in documented.items() if scope == "watched namespaces"}
    for namespace in ("rl-a", "rl-b"):
        assert rules_as_table(roles[(namespace, "rf-rollout-fleet")]["rules"]) == want
    bindings = {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in by_kind(chart_docs_full, "RoleBinding")}
    assert bindings == {
        ("rl-a", "rf-rollout-fleet"),
        ("rl-b", "rf-rollout-fleet"),
        ("fleet-system", "rf-rollout-fleet-leader-election"),
    }


def test_reader_cluster_role_only_reads_the_three_kinds(chart_docs_full: list[dict[str, Any]]) -> None:
    (reader,) = [r for r in by_kind(chart_docs_full, "ClusterRole") if r["metadata"]["name"] == "rollout-fleet-reader"]
    assert rules_as_table(reader["rules"]) == {
        ("rolloutfleet.dev", kind): {"get", "list", "watch"}
        for kind in ("rolloutfleets", "generationshards", "environmentservers")
    }
    assert reader["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"


def test_trainer_role_may_only_write_policy_versions_and_read_fleets(helm: Helm) -> None:
    """The trainer's least privilege (docs/operations.md): one Role and RoleBinding per listed namespace."""
    assert not [r for r in by_kind(render(helm), "Role") if r["metadata"]["name"].endswith("-trainer")]
    docs = render(
        helm,
        "--set", "rbac.trainer.bindings[0].namespace=rl-a", "--set", "rbac.trainer.bindings[0].serviceAccount=trainer",
        "--set", "rbac.trainer.bindings[1].namespace=rl-b", "--set", "rbac.trainer.bindings[1].serviceAccount=learner",
    )  # fmt: skip
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(docs, "Role")}
    for namespace in ("rl-a", "rl-b"):
        assert rules_as_table(roles[(namespace, "rf-rollout-fleet-trainer")]["rules"]) == {
            ("rolloutfleet.dev", "policyversions"): {"get", "create", "patch"},
            ("rolloutfleet.dev", "rolloutfleets"): {"get", "list", "watch"},
        }
    subjects = {
        (b["metadata"]["namespace"], b["roleRef"]["name"], s["name"], s["namespace"])
        for b in by_kind(docs, "RoleBinding")
        for s in b["subjects"]
        if b["roleRef"]["name"].endswith("-trainer")
    }
    assert subjects == {
        ("rl-a", "rf-rollout-fleet-trainer", "trainer", "rl-a"),
        ("rl-b", "rf-rollout-fleet-trainer", "learner", "rl-b"),
    }


def test_pod_monitor_alternative_scrapes_the_operator_pods_like_the_service_monitor(helm: Helm) -> None:
    docs = render(helm, "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.service.enabled=false")
    assert not by_kind(docs, "ServiceMonitor")
    assert not by_kind(docs, "Service")
    (monitor,) = by_kind(docs, "PodMonitor")
    jsonschema.validate(monitor, MONITORING_SCHEMAS["PodMonitor"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True
    assert {"targetLabel": "job", "replacement": "rollout-fleet-operator"} in endpoint["relabelings"]
    (deployment,) = by_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    container_ports = {port["name"] for port in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert endpoint["port"] in container_ports


def test_registrar_cluster_role_is_opt_in_and_only_manages_generationshards(
    chart_docs_default: list[dict[str, Any]], chart_docs_full: list[dict[str, Any]]
) -> None:
    assert "rollout-fleet-registrar" not in {r["metadata"]["name"] for r in by_kind(chart_docs_default, "ClusterRole")}
    (registrar,) = [
        r for r in by_kind(chart_docs_full, "ClusterRole") if r["metadata"]["name"] == "rollout-fleet-registrar"
    ]
    assert rules_as_table(registrar["rules"]) == {
        ("rolloutfleet.dev", "generationshards"): {"create", "get", "patch", "delete"}
    }


def test_pod_discovery_off_drops_the_pod_and_endpointslice_rules(helm: Helm) -> None:
    docs = render(helm, "--set", "operator.podDiscovery.enabled=false")
    (role,) = [r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"] == "rf-rollout-fleet"]
    table = rules_as_table(role["rules"])
    assert ("", "pods") not in table
    assert ("discovery.k8s.io", "endpointslices") not in table
    (deployment,) = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FLEET_OPERATOR_POD_DISCOVERY"] == "false"
