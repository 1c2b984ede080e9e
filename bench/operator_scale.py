"""Benchmark 3: the operator at scale on the real kube-apiserver.

1,000 GenerationShards across 10 RolloutFleets (served by a handful of simulated shard processes: many shards share
an endpoint, which the operator probes once per shard like any other), the real etcd + kube-apiserver from the test
tool cache, and ``rollout-fleet operator`` as its own process. Measured:

- operator CPU (share of one core) and peak RSS over a steady window, beside a same-run baseline: a bare
  HealthMonitor + HttpProber (the runtime's probe loop, no Kubernetes) probing the same targets at the same period;
- probes per second sustained (``fleet_probe_duration_seconds_count``) against the nominal shards / period;
- status writes per second, from the operator (``fleet_status_writes_total``) and from the apiserver's own
  ``apiserver_request_total`` (PATCH .../status), against the budget: health transitions plus one heartbeat per
  shard and per fleet per ``status_heartbeat_seconds`` (60 s);
- time from SIGKILL of a simulated shard process to its shards leaving the fleet's published healthy set, against
  the detection bound failureThreshold x periodSeconds (and + timeoutSeconds, the bound per-target timers keep),
  while 10 of the shards (one per fleet) are blackholes probed with the largest timeout the CRD allows (3599 s of a
  3600 s period): a socket that accepts connections and never answers, so their probes stay pending throughout.

    python bench/operator_scale.py            # full: 1000 shards, 10 fleets, 5 s probes, 120 s window (~5 min)
    python bench/operator_scale.py --smoke    # 20 shards, 2 fleets (CI)
    python bench/operator_scale.py --pods     # pod mode: 1,000 selected pods over 10 fleets, then 100 replaced in 10 s

Needs kube-apiserver and etcd from ``bash scripts/install-tools.sh``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _proc import cpu_seconds, rss_mib
from rollout_runtime.kube import kinds

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # ControlPlane is test infrastructure (kept out of the wheel)
sys.path.insert(0, str(REPO / "tools"))  # which it finds through the pins in tools/versions.env (tools/pins.py)

from rollout_runtime.sim.process import ManagedProcess, free_port, wait_until  # noqa: E402
from support.controlplane import ControlPlane  # noqa: E402

MARKER = "operator scale ratios"
ROLLOUT_FLEET = str(Path(sys.executable).parent / "rollout-fleet")
NAMESPACE = "bench"
HEARTBEAT_SECONDS = 60.0
BLACKHOLE_PROBE = {"periodSeconds": 3600.0, "timeoutSeconds": 3599.0, "failureThreshold": 3, "successThreshold": 2}
"""The largest timeout the CRD allows (timeoutSeconds < periodSeconds <= 3600): one probe an hour that never ends."""


@dataclass(frozen=True)
class Scale:
    shards: int
    fleets: int
    sims: int
    """Simulated shard processes serving the shards (plus one victim process that is killed)."""
    victims: int
    """Shards of fleet-0 served by the victim process."""
    blackholes: int
    """The last shards (one per fleet while there are fleets) point at a socket that never answers."""
    period: float
    timeout: float
    failure_threshold: int
    window: float
    """Steady-state measurement window (seconds)."""
    baseline_window: float


FULL = Scale(
    shards=1000,
    fleets=10,
    sims=8,
    victims=10,
    blackholes=10,
    period=5.0,
    timeout=2.0,
    failure_threshold=3,
    window=120.0,
    baseline_window=60.0,
)
SMOKE = Scale(
    shards=20,
    fleets=2,
    sims=2,
    victims=2,
    blackholes=2,
    period=1.0,
    timeout=0.5,
    failure_threshold=2,
    window=6.0,
    baseline_window=4.0,
)


# -- processes and measurements --------------------------------------------------------------------------------


def scrape(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return str(response.read().decode())


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(rf"{re.escape(name)}(?:{{(.*)}})? (\S+)", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


@dataclass
class Sims:
    """Sim shard processes on 127.0.0.1 (ManagedProcess: stopped by pid)."""

    processes: list[ManagedProcess]
    ports: list[int]

    def stop(self) -> None:
        for process in self.processes:
            process.stop()


@contextmanager
def sim_processes(count: int, log_dir: Path) -> Iterator[Sims]:
    ports = [free_port() for _ in range(count)]
    processes = [
        ManagedProcess(
            f"sim-{i}",
            [
                sys.executable,
                "-m",
                "rollout_runtime.cli.sim_shard",
                "--port",
                str(port),
                "--model",
                "sim-model",
                "--exit-with-parent",
            ],
            log_dir / f"sim-{i}.log",
        )
        for i, port in enumerate(ports)
    ]
    sims = Sims(processes, ports)
    try:
        for process in processes:
            process.start()
        for process, port in zip(processes, ports, strict=True):
            wait_until(
                lambda port=port: _http_ok(f"http://127.0.0.1:{port}/health"),
                timeout=60,
                what=process.name,
                process=process,
            )
        yield sims
    finally:
        sims.stop()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


@contextmanager
def blackhole_port() -> Iterator[int]:
    """A listening socket that never accepts: the kernel completes connections, nothing ever answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        yield int(sock.getsockname()[1])


# -- the objects -------------------------------------------------------------------------------------------------


def shard_endpoints(scale: Scale, ports: Sequence[int], victim_port: int, hole_port: int) -> dict[str, tuple[str, str]]:
    """Shard name -> (fleet, endpoint). The first ``victims`` shards of fleet-0 are served by the victim process;
    the last ``blackholes`` shards point at the blackhole."""
    layout: dict[str, tuple[str, str]] = {}
    victims = 0
    for i in range(scale.shards):
        fleet = f"fleet-{i % scale.fleets}"
        if i >= scale.shards - scale.blackholes:
            port = hole_port
        elif fleet == "fleet-0" and victims < scale.victims:
            port, victims = victim_port, victims + 1
        else:
            port = ports[i % len(ports)]
        layout[f"shard-{i:04d}"] = (fleet, f"http://127.0.0.1:{port}")
    return layout


def is_blackhole(scale: Scale, name: str) -> bool:
    return int(name.rsplit("-", 1)[1]) >= scale.shards - scale.blackholes


def objects(scale: Scale, layout: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    probe = {
        "periodSeconds": scale.period,
        "timeoutSeconds": scale.timeout,
        "failureThreshold": scale.failure_threshold,
        "successThreshold": 2,
    }
    shards = [
        {
            "apiVersion": kinds.API_VERSION,
            "kind": kinds.GENERATION_SHARD.kind,
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"fleet": fleet}},
            "spec": {
                "endpoint": endpoint,
                "model": "sim-model",
                "probe": BLACKHOLE_PROBE if is_blackhole(scale, name) else probe,
            },
        }
        for name, (fleet, endpoint) in layout.items()
    ]
    fleets = [
        {
            "apiVersion": kinds.API_VERSION,
            "kind": kinds.ROLLOUT_FLEET.kind,
            "metadata": {"name": f"fleet-{f}", "namespace": NAMESPACE},
            "spec": {"shardSelector": {"matchLabels": {"fleet": f"fleet-{f}"}}},
        }
        for f in range(scale.fleets)
    ]
    return shards + fleets


def create(plane: ControlPlane, items: list[dict[str, Any]], chunk: int = 200) -> None:
    for start in range(0, len(items), chunk):
        document = {"apiVersion": "v1", "kind": "List", "items": items[start : start + chunk]}
        plane.kubectl("create", "-f", "-", input=json.dumps(document), timeout=300)


class Api:
    """Tiny admin client for polling (urllib: no client library in the measurement loop)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.base = plane.url
        self.token = plane.token
        self.context = ssl.create_default_context(cafile=str(plane.ca_file))

    def get(self, path: str) -> Any:
        return json.loads(scrape(self.base + path, self.context, self.token))

    def fleets(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get(
            f"/apis/{kinds.API_VERSION}/namespaces/{NAMESPACE}/{kinds.ROLLOUT_FLEET.plural}"
        )["items"]
        return items

    def metrics(self) -> str:
        return scrape(self.base + "/metrics", self.context, self.token)


_WRITTEN_PLURALS = (kinds.GENERATION_SHARD.plural, kinds.ROLLOUT_FLEET.plural)
"""The kinds this benchmark creates, whose status the operator writes."""


def status_patch_seconds(api_metrics: str) -> tuple[float, float]:
    """(sum of seconds, count) of the apiserver's PATCH .../status request durations for our resources."""
    labels = {"verb": "PATCH", "group": kinds.GROUP, "subresource": "status"}
    total = count = 0.0
    for resource in _WRITTEN_PLURALS:
        total += metric_sum(api_metrics, "apiserver_request_duration_seconds_sum", resource=resource, **labels)
        count += metric_sum(api_metrics, "apiserver_request_duration_seconds_count", resource=resource, **labels)
    return total, count


def status_patches(api_metrics: str) -> float:
    """PATCHes of our resources' status subresource the apiserver has served."""
    return sum(
        metric_sum(
            api_metrics,
            "apiserver_request_total",
            verb="PATCH",
            group=kinds.GROUP,
            resource=resource,
            subresource="status",
        )
        for resource in _WRITTEN_PLURALS
    )


# -- the bare-prober baseline ------------------------------------------------------------------------------------


async def bare_prober(targets_file: Path, seconds: float) -> None:
    """Probe the same targets with the runtime's HealthMonitor and nothing else. Prints a line once every answering
    target was probed (imports and the first burst are not steady state), then the probes of the next ``seconds``."""
    from rollout_runtime.health import HealthMonitor, HttpProber, ProbeSettings, ProbeTarget, ProbeTargetPolicy

    spec = json.loads(targets_file.read_bytes())  # noqa: ASYNC240 (once, before the loop starts)
    settings = ProbeSettings(
        period_seconds=spec["period"],
        timeout_seconds=spec["timeout"],
        failure_threshold=spec["failure_threshold"],
        success_threshold=2,
    )
    hole = ProbeSettings.model_validate(BLACKHOLE_PROBE)
    targets = [
        ProbeTarget(name, endpoint, hole if name in spec["blackholes"] else settings, "sim-model")
        for name, endpoint in spec["targets"].items()
    ]
    answering = len(targets) - len(spec["blackholes"])
    seen: set[str] = set()
    probes = 0
    start: float | None = None
    async with HttpProber(ProbeTargetPolicy.local()) as prober:
        monitor = HealthMonitor(targets, prober, max_concurrency=128)  # the operator's default probe concurrency
        async for round_ in monitor.rounds():  # count the probes that finished in [start, start + seconds)
            if start is None and len(seen.union(round_.results)) < answering:  # the first burst is not steady
                seen.update(round_.results)
                continue
            if start is None:
                start = time.time()
                print("ready", flush=True)
                continue
            probes += sum(start <= result.at < start + seconds for result in round_.results.values())
            if time.time() >= start + seconds:
                break
    print(json.dumps({"probes": probes, "seconds": seconds}), flush=True)


def run_baseline(scale: Scale, layout: dict[str, tuple[str, str]], workdir: Path) -> tuple[float, float, float]:
    """(CPU share of one core, peak RSS MiB, probes/s) of the bare prober in steady state."""
    targets = workdir / "targets.json"
    targets.write_text(
        json.dumps(
            {
                "period": scale.period,
                "timeout": scale.timeout,
                "failure_threshold": scale.failure_threshold,
                "targets": {n: e for n, (_f, e) in layout.items()},
                "blackholes": [n for n in layout if is_blackhole(scale, n)],
            }
        )
    )
    argv = [sys.executable, __file__, "--bare-prober", str(targets), "--seconds", str(scale.baseline_window)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the bare prober did not start")
        cpu0, t0, peak = cpu_seconds(process.pid), time.monotonic(), 0.0
        cpu1, t1 = cpu0, t0
        while process.poll() is None and time.monotonic() - t0 < scale.baseline_window:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
                cpu1, t1, peak = cpu_seconds(process.pid), time.monotonic(), max(peak, rss_mib(process.pid))
            time.sleep(0.25)
        out, _ = process.communicate(timeout=60)
    done = json.loads(out.strip().splitlines()[-1])
    return (cpu1 - cpu0) / max(t1 - t0, 1e-9), peak, done["probes"] / done["seconds"]


# -- the run ---------------------------------------------------------------------------------------------------


@dataclass
class Result:
    settle_seconds: float
    cpu_share: float
    rss_peak: float
    probes_per_second: float
    writes_operator: float
    writes_apiserver: float
    transitions: float
    budget: float
    apiserver_cpu_share: float
    patch_ms: float
    """Mean apiserver-side duration of one status PATCH in the window."""
    drop: Drop
    holes_pending: int
    """Blackhole shards still Pending after the drop: their first probe never ended, so nothing waited for it."""
    baseline_cpu: float
    baseline_rss: float
    baseline_probes: float


def run(scale: Scale, keep: bool, crds: Path) -> Result:
    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    plane = ControlPlane(workdir / "plane")
    try:
        t = time.monotonic()
        plane.start()
        print(f"  control plane up in {time.monotonic() - t:.1f}s")
        plane.kubectl("apply", "-f", str(crds))
        for names in kinds.KINDS:
            plane.kubectl("wait", "--for=condition=Established", f"crd/{names.crd_name}", "--timeout=60s")
        for plural in (names.plural for names in kinds.KINDS):  # a new CRD answers 429 a moment
            wait_until(
                lambda plural=plural: plane.kubectl("get", plural, "-A", check=False).returncode == 0,
                timeout=60,
                what=f"{plural} served",
            )
        plane.create_namespace(NAMESPACE)
        with sim_processes(scale.sims + 1, workdir / "sims") as sims, blackhole_port() as hole_port:
            victim_process, victim_port = sims.processes[-1], sims.ports[-1]
            layout = shard_endpoints(scale, sims.ports[:-1], victim_port, hole_port)
            t = time.monotonic()
            create(plane, objects(scale, layout))
            print(
                f"  created {scale.shards} GenerationShards and {scale.fleets} RolloutFleets in "
                f"{time.monotonic() - t:.1f}s"
            )
            baseline_cpu, baseline_rss, baseline_probes = run_baseline(scale, layout, workdir)
            print(f"  baseline bare prober: {baseline_cpu:.1%} CPU, {baseline_probes:.0f} probes/s")
            return measure_operator(
                scale, plane, victim_process, layout, workdir, (baseline_cpu, baseline_rss, baseline_probes)
            )
    finally:
        plane.stop()
        if keep:
            print(f"  kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def operator_process(plane: ControlPlane, workdir: Path) -> tuple[ManagedProcess, str]:
    """The operator under test (not started): watching NAMESPACE, no leader election, its /metrics URL."""
    port = free_port()
    env = {
        **os.environ,
        "FLEET_OPERATOR_KUBECONFIG": str(plane.kubeconfig),
        "FLEET_OPERATOR_NAMESPACES": NAMESPACE,
        "FLEET_OPERATOR_LEADER_ELECTION": "false",
        "FLEET_OPERATOR_PROBE_ALLOW_LOOPBACK": "true",
        "FLEET_OPERATOR_HTTP_HOST": "127.0.0.1",
        "FLEET_OPERATOR_HTTP_PORT": str(port),
        "FLEET_OPERATOR_LOG_LEVEL": "WARNING",
        "FLEET_OPERATOR_STATUS_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
    }
    operator = ManagedProcess("operator", [ROLLOUT_FLEET, "operator"], workdir / "operator.log", env=env)
    return operator, f"http://127.0.0.1:{port}/metrics"


def measure_operator(
    scale: Scale,
    plane: ControlPlane,
    victim: ManagedProcess,
    layout: dict[str, tuple[str, str]],
    workdir: Path,
    baseline: tuple[float, float, float],
) -> Result:
    api = Api(plane)
    operator, metrics_url = operator_process(plane, workdir)
    started = time.monotonic()
    operator.start()
    try:
        ready = metrics_url.removesuffix("/metrics") + "/readyz"
        wait_until(lambda: _http_ok(ready), timeout=120, what="operator /readyz", process=operator)

        holes = collections.Counter(fleet for name, (fleet, _e) in layout.items() if is_blackhole(scale, name))

        def all_ready() -> bool:  # every shard but the blackholes
            fleets = api.fleets()
            return len(fleets) == scale.fleets and all(
                f.get("status", {}).get("readyShards")
                == f.get("status", {}).get("totalShards", -1) - holes[f["metadata"]["name"]]
                > 0
                for f in fleets
            )

        wait_until(all_ready, timeout=max(600.0, 20 * scale.period), what="every fleet fully healthy", process=operator)
        settle = time.monotonic() - started
        print(f"  operator: every fleet fully healthy {settle:.1f}s after start")
        time.sleep(min(scale.period, 5.0))  # let the first heartbeat wave and startup writes pass
        pid = operator.pid
        assert pid is not None
        apiserver_pid = plane.apiserver.pid
        assert apiserver_pid is not None
        before_op, before_api = scrape(metrics_url), api.metrics()
        cpu0, api_cpu0, t0, peak = cpu_seconds(pid), cpu_seconds(apiserver_pid), time.monotonic(), 0.0
        while time.monotonic() - t0 < scale.window:
            peak = max(peak, rss_mib(pid))
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        cpu1, api_cpu1 = cpu_seconds(pid), cpu_seconds(apiserver_pid)
        after_op, after_api = scrape(metrics_url), api.metrics()

        def delta(name: str, **labels: str) -> float:
            return metric_sum(after_op, name, **labels) - metric_sum(before_op, name, **labels)

        probes = delta("fleet_probe_duration_seconds_count", kind="GenerationShard")
        writes = delta("fleet_status_writes_total")
        transitions = delta("fleet_health_transitions_total")
        patches = status_patches(after_api) - status_patches(before_api)
        (sum1, n1), (sum0, n0) = status_patch_seconds(after_api), status_patch_seconds(before_api)
        budget = transitions + (scale.shards + scale.fleets) * elapsed / HEARTBEAT_SECONDS
        drop = time_to_drop(scale, api, victim, layout)
        shard_path = f"/apis/{kinds.API_VERSION}/namespaces/{NAMESPACE}/{kinds.GENERATION_SHARD.plural}"
        holes_pending = sum(
            api.get(f"{shard_path}/{name}").get("status", {}).get("phase", "Pending") == "Pending"
            for name in layout
            if is_blackhole(scale, name)
        )
        return Result(
            settle_seconds=settle,
            cpu_share=(cpu1 - cpu0) / elapsed,
            rss_peak=peak,
            probes_per_second=probes / elapsed,
            writes_operator=writes / elapsed,
            writes_apiserver=patches / elapsed,
            transitions=transitions,
            budget=budget / elapsed,
            apiserver_cpu_share=(api_cpu1 - api_cpu0) / elapsed,
            patch_ms=(sum1 - sum0) / (n1 - n0) * 1000 if n1 > n0 else 0.0,
            drop=drop,
            holes_pending=holes_pending,
            baseline_cpu=baseline[0],
            baseline_rss=baseline[1],
            baseline_probes=baseline[2],
        )
    finally:
        operator.stop()


@dataclass
class Drop:
    """Seconds from SIGKILL of the victim process to each step of the news reaching the fleet's status."""

    shard_unhealthy: float | None = None
    """The first victim shard's own status says Unhealthy (probes detected it, its status was written)."""
    first_out: float | None = None
    """The first victim shard left fleet-0's published healthy set."""
    all_out: float | None = None
    """Every victim shard left it."""


def time_to_drop(scale: Scale, api: Api, victim: ManagedProcess, layout: dict[str, tuple[str, str]]) -> Drop:
    """SIGKILL the victim process and watch its shards' statuses and fleet-0's published healthy set."""
    victims = {name for name, (_fleet, endpoint) in layout.items() if endpoint.endswith(f":{_port(victim)}")}
    fleet_path = f"/apis/{kinds.API_VERSION}/namespaces/{NAMESPACE}/{kinds.ROLLOUT_FLEET.plural}/fleet-0"
    shard_path = f"/apis/{kinds.API_VERSION}/namespaces/{NAMESPACE}/{kinds.GENERATION_SHARD.plural}/{min(victims)}"
    drop = Drop()
    victim.kill()
    killed = time.monotonic()
    deadline = killed + 10 * scale.failure_threshold * scale.period + 30
    while time.monotonic() < deadline:
        listed = {entry["name"] for entry in api.get(fleet_path).get("status", {}).get("shards", [])}
        phase = api.get(shard_path).get("status", {}).get("phase") if drop.shard_unhealthy is None else None
        remaining = victims & listed
        now = time.monotonic() - killed
        if phase == "Unhealthy":
            drop.shard_unhealthy = now
        if drop.first_out is None and len(remaining) < len(victims):
            drop.first_out = now
        if not remaining:
            drop.all_out = now
            break
        time.sleep(0.05)
    while drop.shard_unhealthy is None and time.monotonic() < deadline:
        if api.get(shard_path).get("status", {}).get("phase") == "Unhealthy":
            drop.shard_unhealthy = time.monotonic() - killed
        time.sleep(0.05)
    return drop


def _port(process: ManagedProcess) -> str:
    return str(process.argv[process.argv.index("--port") + 1])


# -- report ----------------------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def report(scale: Scale, r: Result) -> None:
    nominal = (scale.shards - scale.blackholes) / scale.period  # a blackhole is probed once an hour
    bound = scale.failure_threshold * scale.period
    print(
        f"\n{scale.shards} GenerationShards, {scale.fleets} fleets, probes every {scale.period:g}s "
        f"(timeout {scale.timeout:g}s, failureThreshold {scale.failure_threshold}), "
        f"window {scale.window:g}s; {scale.blackholes} of them blackholes probed with timeout "
        f"{BLACKHOLE_PROBE['timeoutSeconds']:g}s"
    )
    print(f"  all fleets fully healthy after operator start:  {r.settle_seconds:8.1f} s")
    print(f"  operator CPU (share of one core):               {r.cpu_share:8.1%}   bare prober {r.baseline_cpu:.1%}")
    print(
        f"  operator peak RSS:                              {r.rss_peak:8.0f} MiB bare prober {r.baseline_rss:.0f} MiB"
    )
    print(
        f"  probes per second sustained:                    {r.probes_per_second:8.1f}   nominal {nominal:.1f}, "
        f"bare prober {r.baseline_probes:.1f}"
    )
    print(f"  status writes/s (operator metric):              {r.writes_operator:8.2f}")
    print(f"  status PATCHes/s (apiserver_request_total):     {r.writes_apiserver:8.2f}")
    print(f"  write budget/s (transitions {r.transitions:.0f} + 1 heartbeat/target/min): {r.budget:8.2f}")
    print(f"  kube-apiserver CPU (share of one core):         {r.apiserver_cpu_share:8.1%}")
    print(
        f"  status PATCH duration at the apiserver (mean):  {r.patch_ms:8.1f} ms -> one sequential writer is busy "
        f"{r.writes_apiserver * r.patch_ms / 1000:.0%} of the time"
    )
    d = r.drop
    print(
        f"  SIGKILL of the process serving {scale.victims} shards -> a victim's own status Unhealthy: "
        f"{_s(d.shard_unhealthy)} s; first / all victims out of the fleet's healthy set: {_s(d.first_out)} / "
        f"{_s(d.all_out)} s (detection bound failureThreshold x period = {bound:g} s, "
        f"+ timeout = {bound + scale.timeout:g} s)"
    )
    print(f"\n{MARKER}:")
    print(f"  operator CPU / bare prober CPU:      {r.cpu_share / r.baseline_cpu:6.2f}x" if r.baseline_cpu else "")
    print(f"  probes/s / nominal:                  {r.probes_per_second / nominal:6.2f}x")
    print(f"  apiserver status writes / budget:    {r.writes_apiserver / r.budget:6.2f}x  (target <= 1)")
    print(
        f"  operator-counted writes / apiserver: {r.writes_operator / r.writes_apiserver:6.2f}x"
        if r.writes_apiserver
        else "  operator-counted writes / apiserver: no writes"
    )
    if d.all_out is not None:
        print(
            f"  death -> fleet status / bound:       {d.all_out / bound:6.2f}x  (bound + timeout: "
            f"{d.all_out / (bound + scale.timeout):.2f}x; "
            f"{r.holes_pending}/{scale.blackholes} blackholes still pending)"
        )


# -- pod mode: fleets that select pods ---------------------------------------------------------------------------

POD_FLEET_RESOURCES = ("pods", "endpointslices", *(names.plural for names in kinds.KINDS), "events")
"""What the operator talks to in pod mode (apiserver_request_total by resource)."""


@dataclass
class PodResult:
    pods: int
    fleets: int
    settle_seconds: float
    cpu_share: float
    baseline_cpu: float
    baseline_probes: float
    probes_per_second: float
    requests_per_second: dict[str, float]
    """Operator requests per second in the steady window, by verb (the benchmark itself makes none then)."""
    open_watches: float
    """Watches open on the resources the operator reads (apiserver_longrunning_requests)."""
    churn_seconds: float
    """Seconds from the first to the last replacement (each: force-delete, create, report Ready)."""
    right_after_churn: float | None
    """Seconds from the last replacement until every fleet's published set is the new set of pods."""
    churn_lists: float
    """LIST requests on pods during the churn (watch, never poll: 0 expected)."""
    churn_requests_per_second: dict[str, float]


def _requests(api_metrics: str, verbs: Sequence[str] = ("LIST", "WATCH", "GET", "PATCH", "POST")) -> dict[str, float]:
    return {
        verb: sum(
            metric_sum(api_metrics, "apiserver_request_total", verb=verb, resource=resource)
            for resource in POD_FLEET_RESOURCES
        )
        for verb in verbs
    }


def pod_body(name: str, fleet: str, port: int) -> dict[str, Any]:
    """A pod bound to the loopback node; its status (127.0.0.1, Ready) is written next, as a kubelet would."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"fleet": fleet}},
        "spec": {
            "nodeName": "bench-node",
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "sim", "ports": [{"name": "http", "containerPort": port}]}],
        },
    }


POD_STATUS = {
    "phase": "Running",
    "podIP": "127.0.0.1",
    "podIPs": [{"ip": "127.0.0.1"}],
    "conditions": [{"type": "Ready", "status": "True"}],
    "containerStatuses": [
        {"name": "c", "ready": True, "restartCount": 0, "image": "sim", "imageID": "", "state": {"running": {}}}
    ],
}


async def _pods(plane: ControlPlane, create: Sequence[tuple[str, str, int]], delete: Sequence[str] = ()) -> None:
    """Create pods (name, fleet, port) and report them Ready, and force-delete others, 32 requests at a time."""
    from kubernetes_asyncio import client, config

    async with await config.new_client_from_config(config_file=str(plane.kubeconfig)) as api:
        core = client.CoreV1Api(api)
        limit = asyncio.Semaphore(32)

        async def one(name: str, fleet: str, port: int) -> None:
            async with limit:
                await core.create_namespaced_pod(NAMESPACE, pod_body(name, fleet, port))
                await core.patch_namespaced_pod_status(name, NAMESPACE, {"status": POD_STATUS})

        async def gone(name: str) -> None:
            async with limit:
                await core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)

        await asyncio.gather(*(one(*spec) for spec in create), *(gone(name) for name in delete))


def pod_fleet(name: str, probe: dict[str, Any]) -> dict[str, Any]:
    """A RolloutFleet selecting the pods labelled ``fleet: <name>`` at their container port ``http``."""
    selection = {"selector": {"matchLabels": {"fleet": name}}, "targetPort": {"name": "http"}, "probe": probe}
    return {
        "apiVersion": kinds.API_VERSION,
        "kind": kinds.ROLLOUT_FLEET.kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"shardPods": {**selection, "model": "sim-model"}},
    }


def run_pods(scale: Scale, keep: bool, crds: Path) -> PodResult:
    """1,000 selected pods over 10 fleets on the real apiserver, then churn: 100 pods replaced within 10 s."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-pods-"))
    plane = ControlPlane(workdir / "plane")
    churn_size = max(1, scale.shards // 10)
    try:
        plane.start()
        plane.kubectl("apply", "-f", str(crds))
        for names in kinds.KINDS:
            plane.kubectl("wait", "--for=condition=Established", f"crd/{names.crd_name}", "--timeout=60s")
        plane.create_namespace(NAMESPACE)
        plane.apply(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}, namespace=NAMESPACE
        )
        plane.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench-node"}})
        with sim_processes(scale.sims, workdir / "sims") as sims:
            specs = [(f"pod-{i:04d}", f"fleet-{i % scale.fleets}", sims.ports[i % len(sims.ports)])
                     for i in range(scale.shards)]  # fmt: skip
            t = time.monotonic()
            asyncio.run(_pods(plane, specs))
            probe = {"periodSeconds": scale.period, "timeoutSeconds": scale.timeout,
                     "failureThreshold": scale.failure_threshold, "successThreshold": 2}  # fmt: skip
            create(plane, [pod_fleet(f"fleet-{f}", probe) for f in range(scale.fleets)])
            took = time.monotonic() - t
            print(f"  created {scale.shards} Ready pods and {scale.fleets} pod-selecting fleets in {took:.1f}s")
            layout = {name: (fleet, f"http://127.0.0.1:{port}") for name, fleet, port in specs}
            no_holes = Scale(**{**vars(scale), "blackholes": 0})
            baseline_cpu, _rss, baseline_probes = run_baseline(no_holes, layout, workdir)
            print(f"  baseline bare prober: {baseline_cpu:.1%} CPU, {baseline_probes:.0f} probes/s")
            return _measure_pods(scale, plane, workdir, specs, churn_size, (baseline_cpu, baseline_probes))
    finally:
        plane.stop()
        if keep:
            print(f"  kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _measure_pods(
    scale: Scale,
    plane: ControlPlane,
    workdir: Path,
    specs: list[tuple[str, str, int]],
    churn_size: int,
    baseline: tuple[float, float],
) -> PodResult:
    api = Api(plane)
    operator, metrics_url = operator_process(plane, workdir)
    expected: dict[str, set[str]] = collections.defaultdict(set)
    for name, fleet, _port in specs:
        expected[fleet].add(name)

    def fleets_right() -> bool:
        published = {
            f["metadata"]["name"]: {e["name"] for e in f.get("status", {}).get("shards", [])} for f in api.fleets()
        }
        return all(published.get(fleet) == names for fleet, names in expected.items())

    started = time.monotonic()
    operator.start()
    try:
        wait_until(fleets_right, timeout=max(600.0, 20 * scale.period), what="every fleet's pods healthy",
                   process=operator, interval=0.25)  # fmt: skip
        settle = time.monotonic() - started
        print(f"  operator: every fleet publishes its pods {settle:.1f}s after start")
        time.sleep(min(scale.period, 5.0))
        pid = operator.pid
        assert pid is not None
        before_op, before_api = scrape(metrics_url), api.metrics()
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(scale.window)  # the steady window: nothing but the operator talks to the apiserver
        elapsed = time.monotonic() - t0
        cpu1 = cpu_seconds(pid)
        after_op, after_api = scrape(metrics_url), api.metrics()
        before_requests = _requests(before_api)
        steady = {verb: (n - before_requests[verb]) / elapsed for verb, n in _requests(after_api).items()}
        watches = sum(
            metric_sum(after_api, "apiserver_longrunning_requests", verb="WATCH", resource=resource)
            for resource in POD_FLEET_RESOURCES
        )
        probes = metric_sum(after_op, "fleet_probe_duration_seconds_count") - metric_sum(
            before_op, "fleet_probe_duration_seconds_count"
        )

        # Churn: replace churn_size pods (force-delete, create a new one on the same port) spread over 10 s.
        victims = specs[:: max(1, len(specs) // churn_size)][:churn_size]
        batches = 10
        churn_api0 = api.metrics()
        churn_start = last_change = time.monotonic()
        for b in range(batches):
            batch = victims[b::batches]
            fresh = [(f"new-{name}", fleet, port) for name, fleet, port in batch]
            if not batch:
                continue
            asyncio.run(_pods(plane, fresh, [name for name, _f, _p in batch]))
            last_change = time.monotonic()
            for (old, fleet, _port), (new, _f, _p) in zip(batch, fresh, strict=True):
                expected[fleet].discard(old)
                expected[fleet].add(new)
            pause = churn_start + (b + 1) * (10.0 / batches) - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        churn_seconds = last_change - churn_start
        right: float | None = None
        deadline = last_change + 10 * scale.failure_threshold * scale.period + 60
        while time.monotonic() < deadline:
            if fleets_right():
                right = time.monotonic() - last_change
                break
            time.sleep(0.1)
        churn_elapsed = time.monotonic() - churn_start
        churn_api1 = api.metrics()
        lists = metric_sum(churn_api1, "apiserver_request_total", verb="LIST", resource="pods") - metric_sum(
            churn_api0, "apiserver_request_total", verb="LIST", resource="pods"
        )
        churn_rates = {"PATCH": (status_patches(churn_api1) - status_patches(churn_api0)) / churn_elapsed}
        return PodResult(
            pods=len(specs),
            fleets=scale.fleets,
            settle_seconds=settle,
            cpu_share=(cpu1 - cpu0) / elapsed,
            baseline_cpu=baseline[0],
            baseline_probes=baseline[1],
            probes_per_second=probes / elapsed,
            requests_per_second=steady,
            open_watches=watches,
            churn_seconds=churn_seconds,
            right_after_churn=right,
            churn_lists=lists,
            churn_requests_per_second=churn_rates,
        )
    finally:
        operator.stop()


def report_pods(scale: Scale, r: PodResult) -> None:
    churned = max(1, scale.shards // 10)
    print(
        f"\n{r.pods} selected pods over {r.fleets} fleets (shardPods by label, one member per pod), probes every "
        f"{scale.period:g}s, window {scale.window:g}s"
    )
    print(f"  every fleet publishes its pods after operator start: {r.settle_seconds:8.1f} s")
    print(f"  operator CPU (share of one core):  {r.cpu_share:8.1%}   bare prober {r.baseline_cpu:.1%}")
    print(f"  probes per second sustained:       {r.probes_per_second:8.1f}   bare prober {r.baseline_probes:.1f}")
    rates = ", ".join(f"{verb} {rate:.2f}" for verb, rate in r.requests_per_second.items())
    print(f"  operator API requests/s, steady (by verb): {rates}; watches open: {r.open_watches:.0f}")
    print(
        f"  churn: {churned} pods replaced in {r.churn_seconds:.1f} s; every fleet right again "
        f"{_s(r.right_after_churn)} s after the last one; pod LISTs during churn: {r.churn_lists:.0f}; "
        f"status PATCH/s during churn: {r.churn_requests_per_second.get('PATCH', 0):.2f}"
    )
    print(f"\n{MARKER} (pods):")
    print(f"  operator CPU / bare prober CPU:      {r.cpu_share / r.baseline_cpu:6.2f}x" if r.baseline_cpu else "")
    if r.right_after_churn is not None:
        print(f"  churn end -> fleets right / period:  {r.right_after_churn / scale.period:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--shards", type=int, help="override the shard count")
    parser.add_argument("--window", type=float, help="override the steady window (seconds)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, etcd data)")
    parser.add_argument("--crds", type=Path, default=REPO / "crds", help="CRD directory to install (default: crds/)")
    parser.add_argument("--pods", action="store_true", help="pod mode: fleets select pods; then churn")
    parser.add_argument("--bare-prober", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_prober is not None:
        asyncio.run(bare_prober(args.bare_prober, args.seconds))
        return
    scale = SMOKE if args.smoke else FULL
    if args.shards:
        scale = Scale(**{**vars(scale), "shards": args.shards})
    if args.window:
        scale = Scale(**{**vars(scale), "window": args.window})
    print(f"operator scale benchmark: {scale}")
    if args.pods:
        report_pods(scale, run_pods(scale, args.keep, args.crds))
        return
    report(scale, run(scale, args.keep, args.crds))


if __name__ == "__main__":
    main()
