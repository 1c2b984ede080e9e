"""The README's cluster quickstart against the real kube-apiserver: `kubectl apply -f examples/` is accepted as is
(Deployments, Services and our resources), the operator selects the shards, and the fleet turns healthy once the
examples' containers serve.

There are no kubelets, so no pod runs and no Service routes: the test runs each Deployment's container command
(``rollout-fleet <args>``, the operator image's entrypoint) as a local process, with only its bind address and port
changed, and points each GenerationShard/EnvironmentServer at it (``spec.endpoint`` instead of ``spec.serviceRef``,
which is what the Service's cluster IP would do). What it then asserts is what the README says to expect from
`kubectl get rolloutfleets`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.controlplane import ControlPlane
from support.operator import ROLLOUT_FLEET_CLI, OperatorProcess
from support.processes import ManagedProcess, free_port, wait_until
from support.tools import REPO_ROOT

pytestmark = pytest.mark.e2e

EXAMPLES = REPO_ROOT / "examples"


def example_documents() -> list[dict[str, Any]]:
    return [doc for path in sorted(EXAMPLES.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def local_command(args: list[str], port: int) -> list[str]:
    """A container's arguments with the bind address and port a local process can use."""
    args = list(args)
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(port)
    return [str(ROLLOUT_FLEET_CLI), *args]


@pytest.fixture
def example_servers(tmp_path: Path) -> Iterator[dict[str, int]]:
    """Each example Deployment's container, run locally: Service name -> the port it listens on."""
    docs = example_documents()
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    started: list[ManagedProcess] = []
    ports: dict[str, int] = {}
    try:
        for deployment in (d for d in docs if d["kind"] == "Deployment"):
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            [service] = [n for n, s in services.items() if s["spec"]["selector"].items() <= labels.items()]
            [container] = deployment["spec"]["template"]["spec"]["containers"]
            port = free_port()
            process = ManagedProcess(service, local_command(container["args"], port), tmp_path / f"{service}.log")
            process.start()
            started.append(process)
            ports[service] = port
        for process in started:
            port = ports[process.name]
            wait_until(lambda port=port: _serving(port), timeout=60, what=f"{process.name} /health", process=process)  # type: ignore[misc]
        yield ports
    finally:
        for process in started:
            process.stop()


def _serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def fleet_row(plane: ControlPlane, namespace: str) -> dict[str, str]:
    """`kubectl get rolloutfleets` as the README shows it: the header, then the demo fleet's row by column (a column
    kubectl leaves blank, e.g. STALE before the first status write, is "")."""
    lines = plane.kubectl("get", "rolloutfleets", "-n", namespace).stdout.splitlines()
    header = lines[0].split()
    assert header == ["NAME", "HEALTHY", "READY", "STALE", "ENVS", "AGE"], lines
    starts = [lines[0].index(name) for name in header]
    [line] = [line for line in lines[1:] if line.split()[0] == "demo"]
    cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return dict(zip(header, cells, strict=True))


def _cells(row: dict[str, str], *columns: str) -> list[str]:
    return [row[column] for column in columns]


def test_kubectl_apply_examples_then_the_fleet_turns_healthy(
    fleet_crds: ControlPlane,
    fleet_namespace: str,
    tmp_path: Path,
    operator_processes: list[OperatorProcess],
    example_servers: dict[str, int],
) -> None:
    ns = fleet_namespace
    applied = fleet_crds.kubectl("apply", "-n", ns, "-f", str(EXAMPLES))
    created = set(applied.stdout.split())
    for expected in (
        "deployment.apps/vllm-0",
        "service/vllm-1",
        "service/verifier",
        "rolloutfleet.rolloutfleet.dev/demo",
    ):
        assert expected in created, applied.stdout
    for kind, name in [("GenerationShard", "vllm-0"), ("GenerationShard", "vllm-1"), ("EnvironmentServer", "verifier")]:
        ref = fleet_crds.kubectl_json("get", kind.lower(), name, "-n", ns)["spec"]["serviceRef"]
        assert (
            fleet_crds.kubectl_json("get", "service", ref["name"], "-n", ns)["spec"]["ports"][0]["port"] == ref["port"]
        )

    operator = OperatorProcess(fleet_crds, ns, tmp_path, identity="quickstart")
    operator_processes.append(operator)
    operator.start()
    # Selected but not reachable: the Services have no pods behind them here.
    wait_until(
        lambda: _cells(fleet_row(fleet_crds, ns), "HEALTHY", "READY") == ["0/2", "False"],
        timeout=90,
        what="demo 0/2",
        process=operator.process,
    )

    for kind, name in [("generationshard", "vllm-0"), ("generationshard", "vllm-1"), ("environmentserver", "verifier")]:
        patch = {"spec": {"serviceRef": None, "endpoint": f"http://127.0.0.1:{example_servers[name]}"}}
        fleet_crds.kubectl("patch", kind, name, "-n", ns, "--type=merge", "-p", json.dumps(patch))

    wait_until(
        lambda: _cells(fleet_row(fleet_crds, ns), "HEALTHY", "READY", "STALE", "ENVS") == ["2/2", "True", "0", "1"],
        timeout=120,
        what="demo 2/2 Ready",
        process=operator.process,
    )
    status = fleet_crds.kubectl_json("get", "rolloutfleet", "demo", "-n", ns)["status"]
    assert {entry["name"] for entry in status["shards"]} == {"vllm-0", "vllm-1"}
    assert {entry["name"]: entry["weight"] for entry in status["shards"]}["vllm-1"] == 2
