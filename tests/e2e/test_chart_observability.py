"""Dashboards and alerts against a real Prometheus scraping a real run.

The run: the chart installed into the real kube-apiserver and the operator (as the chart configures it, with its
ServiceAccount) probing simulated shards, while the local demo (``rollout-fleet demo``: a batch through simulated
shards with chaos and over-long prompts) serves the runtime's metrics, and a simulated environment server
(``rollout-fleet sim-env``) runs successful, failed and dependency-failed episodes. A real Prometheus scrapes all
three — the operator as ``job="rollout-fleet-operator"``, as the chart's ServiceMonitor names it — and evaluates the
chart's rule file.

Then: every dashboard panel query (variables expanded) returns finite data; every metric a panel or alert names is
one the run actually exposed; every rule evaluates without error; and the alerts the run provokes (a shard killed:
Degraded; all killed: NoHealthyShards; over-long prompts: DataFailureSpike; the operator stopped: OperatorDown)
become active. The ``for`` durations (minutes) are not waited out: promtool's unit tests cover firing.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_runtime.shards import DEFAULT_FLEET
from support.chart import (
    RULES_FILE,
    alert_rules,
    committed_dashboards,
    dashboard_panels,
    expand_grafana_variables,
    metric_names,
    registered_metric_names,
)
from support.chart_cluster import ROLLOUT_FLEET, fleet_objects, fleet_status, install, start_operator
from support.controlplane import ControlPlane
from support.helm import Helm
from support.processes import ManagedProcess, free_port, wait_until
from support.prometheus import Prometheus

pytestmark = pytest.mark.e2e

OPERATOR_JOB = "rollout-fleet-operator"
TRAINER_JOB = "trainer"
ENVIRONMENT_JOB = "environment"
ROUTER_JOB = "router"


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def active_alerts(prometheus: Prometheus) -> set[str]:
    """Names of alerts pending or firing now."""
    alerts = _get_json(f"{prometheus.url}/api/v1/alerts")["data"]["alerts"]
    return {alert["labels"]["alertname"] for alert in alerts if alert["state"] in {"pending", "firing"}}


def wait_for_alert(prometheus: Prometheus, name: str) -> None:
    """Wait until the alert is pending or firing (its expression returned data), or fail naming what is active."""
    try:
        wait_until(lambda: name in active_alerts(prometheus), timeout=90, what=f"alert {name} active", interval=0.5)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; active: {sorted(active_alerts(prometheus))}") from None


def run_episodes(url: str) -> list[int]:
    """Successful, failed (unparseable problem) and dependency-failed (dead generation URL) episodes over the
    episode protocol (POST /run); the HTTP statuses. Plain urllib: no event loop in this sync test."""
    dead = f"http://127.0.0.1:{free_port()}"
    requests: list[dict[str, str]] = [{"problem": f"{i} + 2", "answer": str(i + 2)} for i in range(12)]
    requests += [{"problem": "not arithmetic", "answer": "1"} for _ in range(3)]
    requests += [{"problem": "1 + 1", "generation_url": dead} for _ in range(3)]
    statuses = []
    for body in requests:
        request = urllib.request.Request(
            f"{url}/run", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                statuses.append(int(response.status))
        except urllib.error.HTTPError as exc:
            statuses.append(int(exc.code))
    return statuses


def router_ready(url: str) -> bool:
    """Whether the router's /readyz says a shard is routable."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def route_status(url: str) -> int:
    """The status of one completion through the router."""
    body = json.dumps({"prompt": "What is 1 + 1?", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
def router_port() -> int:
    """The port ``rollout-fleet router`` will serve on, chosen before Prometheus is configured to scrape it."""
    return free_port()


def route_requests(url: str, count: int) -> list[int]:
    """``count`` completions through the router, then one malformed body; the statuses of the completions."""
    statuses = []
    for index in range(count):
        body = json.dumps({"prompt": f"What is {index} + 1?", "max_tokens": 4}).encode()
        request = urllib.request.Request(
            f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            statuses.append(int(response.status))
    malformed = urllib.request.Request(f"{url}/v1/completions", data=b"{", headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(malformed, timeout=30)
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
    return statuses


@pytest.fixture
def environment_server(tmp_path: Path) -> Iterator[tuple[ManagedProcess, int]]:
    """A simulated environment server (the arithmetic verifier) on a port chosen up front."""
    port = free_port()
    server = ManagedProcess(
        "sim-env",
        [ROLLOUT_FLEET, "sim-env", "--kind", "verifier", "--port", str(port), "--log-level", "WARNING"],
        tmp_path / "sim-env.log",
    )
    server.start()
    try:
        yield server, port
    finally:
        server.stop()


@pytest.fixture
def prometheus(
    tmp_path: Path, environment_server: tuple[ManagedProcess, int], router_port: int
) -> Iterator[tuple[Prometheus, int, int]]:
    """A Prometheus with the chart's rules, scraping the operator, the demo, the environment server and the router."""
    operator_port, demo_port = free_port(), free_port()
    server = Prometheus(tmp_path / "prometheus", [], rule_files=[RULES_FILE])
    config = json.loads(server.config_file.read_text())
    config["scrape_configs"] = [
        {"job_name": OPERATOR_JOB, "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"]}]},
        {"job_name": TRAINER_JOB, "static_configs": [{"targets": [f"127.0.0.1:{demo_port}"]}]},
        {"job_name": ENVIRONMENT_JOB, "static_configs": [{"targets": [f"127.0.0.1:{environment_server[1]}"]}]},
        {"job_name": ROUTER_JOB, "static_configs": [{"targets": [f"127.0.0.1:{router_port}"]}]},
    ]
    server.config_file.write_text(json.dumps(config))
    server.start()
    try:
        yield server, operator_port, demo_port
    finally:
        server.stop()


def test_dashboards_and_alerts_show_data_from_a_real_run(
    helm: Helm,
    control_plane: ControlPlane,
    sim_shards: list[tuple[ManagedProcess, int]],
    prometheus: tuple[Prometheus, int, int],
    environment_server: tuple[ManagedProcess, int],
    router_port: int,
    tmp_path: Path,
) -> None:
    server, operator_port, demo_port = prometheus
    installed = install(helm, control_plane, namespaced=False)
    control_plane.apply(*fleet_objects(installed.fleet_namespace, [port for _, port in sim_shards]))
    operator, _, _ = start_operator(control_plane, installed, tmp_path, port=operator_port)
    demo = ManagedProcess(
        "demo",
        [
            ROLLOUT_FLEET,
            "demo",
            "--shards",
            "3",
            "--prompts",
            "300",
            "--over-long",
            "40",
            "--concurrency",
            "8",
            "--metrics-port",
            str(demo_port),
            "--linger",
            "600",
            "--report-dir",
            str(tmp_path / "demo"),
        ],
        tmp_path / "demo.log",
    )
    router = ManagedProcess(
        "router",
        [ROLLOUT_FLEET, "router", "--port", str(router_port), "--probe-period", "0.5", "--log-level", "WARNING",
         *[arg for _, port in sim_shards for arg in ("--shard", f"http://127.0.0.1:{port}")]],
        tmp_path / "router.log",
    )  # fmt: skip
    try:
        wait_until(
            lambda: fleet_status(control_plane, installed.fleet_namespace).get("readyShards") == 2,
            timeout=60,
            what="fleet with 2 healthy shards",
            process=operator,
        )
        demo.start()

        # Episodes on the environment server: its series must have samples from before and after them.
        env_process, env_port = environment_server
        server.wait_for_series(f'up{{job="{ENVIRONMENT_JOB}"}} == 1', timeout=60)
        statuses = run_episodes(f"http://127.0.0.1:{env_port}")
        assert statuses.count(200) >= 12, statuses
        server.wait_for_series(f'environment_episodes_total{{job="{ENVIRONMENT_JOB}", outcome="success"}} >= 12')
        server.wait_for_series(f'environment_episodes_total{{job="{ENVIRONMENT_JOB}", outcome="failed"}} >= 6')
        server.wait_for_series(f'environment_dependency_failures_total{{job="{ENVIRONMENT_JOB}"}} >= 3')
        env_process.check_alive()

        # Model calls through `rollout-fleet router` in front of the same shards (one malformed: refused, 400).
        router.start()
        server.wait_for_series(f'up{{job="{ROUTER_JOB}"}} == 1', timeout=60)
        router_url = f"http://127.0.0.1:{router_port}"
        wait_until(lambda: router_ready(router_url), timeout=60, what="router with a routable shard", process=router)
        codes = route_requests(f"http://127.0.0.1:{router_port}", 12)
        assert codes.count(200) == 12, codes
        server.wait_for_series(f'router_requests_total{{job="{ROUTER_JOB}", code="200"}} >= 12')
        server.wait_for_series(f'router_refused_total{{job="{ROUTER_JOB}", reason="malformed"}} >= 1')

        # Fleet trouble the operator sees: one shard dies, then the other.
        sim_shards[1][0].kill()
        wait_for_alert(server, "RolloutFleetDegraded")
        sim_shards[0][0].kill()
        wait_for_alert(server, "RolloutFleetNoHealthyShards")

        # The demo's batch ends (its report is written); it keeps serving /metrics (--linger).
        wait_until(lambda: (tmp_path / "demo" / "report.json").exists(), timeout=240, what="demo run", process=demo)
        wait_for_alert(server, "RolloutDataFailureSpike")
        server.wait_for_series(f'rollout_prompts_total{{job="{TRAINER_JOB}", result="completed"}} > 0')

        # The router, with both its shards dead, answers 409 (and keeps its latency panel fed within the window).
        no_shard = [route_status(f"http://127.0.0.1:{router_port}") for _ in range(3)]
        assert no_shard == [409, 409, 409], no_shard
        server.wait_for_series(f'router_requests_total{{job="{ROUTER_JOB}", code="409"}} >= 3')

        # Every panel of every dashboard has finite data.
        empty = []
        for name, dashboard in committed_dashboards().items():
            for panel in dashboard_panels(dashboard):
                for target in panel["targets"]:
                    result = server.query(expand_grafana_variables(target["expr"]))
                    values = [float(sample["value"][1]) for sample in result]
                    if not any(math.isfinite(value) for value in values):
                        empty.append(f"{name}: {panel['title']}: {target['expr']}")
            for variable in dashboard["templating"]["list"]:
                if variable["type"] == "query":
                    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"])
                    assert match, variable["query"]
                    selector, label = match.groups()
                    found = server.query(expand_grafana_variables(selector))
                    local = [sample for sample in found if sample["metric"].get("fleet") == DEFAULT_FLEET]
                    if label == "namespace" and local and len(local) == len(found):
                        continue  # the demo follows a local fleet: no namespace to list; All (.*) still matches it
                    if not any(label in sample["metric"] for sample in found):
                        empty.append(f"{name}: variable {variable['name']}")
        assert not empty, "panels without data:\n" + "\n".join(empty)

        # Every metric the dashboards and alerts name was exposed by the run, and is one the code registers.
        scraped = set(_get_json(f"{server.url}/api/v1/label/__name__/values")["data"])
        used = {
            n
            for d in committed_dashboards().values()
            for p in dashboard_panels(d)
            for t in p["targets"]
            for n in metric_names(t["expr"])
        }
        used |= {n for rule in alert_rules() for n in metric_names(rule["expr"])}
        assert used <= scraped, f"named but never exposed by the run: {sorted(used - scraped)}"
        ours = {n for n in scraped if n.startswith(("rollout_", "fleet_", "environment_", "router_"))}
        assert ours <= registered_metric_names(), sorted(ours - registered_metric_names())

        # Every rule evaluates without error on the real series.
        groups = _get_json(f"{server.url}/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        assert {rule["name"] for rule in rules} == {rule["alert"] for rule in alert_rules()}
        assert all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]
    finally:
        operator.stop()
        router.stop()
    wait_for_alert(server, "RolloutFleetOperatorDown")
    demo.stop()
    assert "Traceback" not in operator.log_path.read_text(), operator.tail(60)
