"""Proof that promtool checks and unit-tests rules, and that prometheus scrapes a prometheus-client exporter."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import pytest

from support.processes import free_port
from support.prometheus import PrometheusFactory, Promtool

RULES = textwrap.dedent("""
    groups:
      - name: infra-test
        rules:
          - alert: InfraTestTargetDown
            expr: up == 0
            for: 1m
            labels:
              severity: warning
            annotations:
              summary: "{{ $labels.instance }} is down"
""")

RULE_TESTS = textwrap.dedent("""
    rule_files: [rules.yml]
    evaluation_interval: 1m
    tests:
      - interval: 1m
        input_series:
          - series: 'up{job="shards", instance="a:8000"}'
            values: '0x5'
          - series: 'up{job="shards", instance="b:8000"}'
            values: '1x5'
        alert_rule_test:
          - eval_time: 30s
            alertname: InfraTestTargetDown
            exp_alerts: []
          - eval_time: 2m
            alertname: InfraTestTargetDown
            exp_alerts:
              - exp_labels: {severity: warning, job: shards, instance: "a:8000"}
                exp_annotations: {summary: "a:8000 is down"}
""")


def test_promtool_checks_and_unit_tests_a_rule_file(promtool: Promtool, tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(RULES)
    (tmp_path / "rules_test.yml").write_text(RULE_TESTS)
    assert "SUCCESS" in promtool.check_rules(tmp_path / "rules.yml").stdout
    assert "SUCCESS" in promtool.test_rules(tmp_path / "rules_test.yml").stdout


def test_promtool_rejects_a_broken_expression(promtool: Promtool, tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_text(RULES.replace("up == 0", "up ==="))
    with pytest.raises(subprocess.CalledProcessError) as failed:
        promtool.check_rules(tmp_path / "bad.yml")
    assert "bad.yml" in failed.value.stdout + failed.value.stderr


@pytest.fixture
def exporter() -> Iterator[str]:
    """A prometheus-client exporter on 127.0.0.1 with one counter at 3; yields its host:port."""
    registry = prometheus_client.CollectorRegistry()
    counter = prometheus_client.Counter("infra_test_requests", "Requests seen by the infra test.", registry=registry)
    counter.inc(3)
    port = free_port()
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_prometheus_scrapes_a_prometheus_client_exporter(prometheus_factory: PrometheusFactory, exporter: str) -> None:
    prometheus = prometheus_factory([exporter], job="infra-test")
    series = prometheus.wait_for_series('infra_test_requests_total{job="infra-test"}')
    assert [(s["metric"]["instance"], s["value"][1]) for s in series] == [(exporter, "3")]
    assert prometheus.query('up{job="infra-test"}')[0]["value"][1] == "1"
