"""The runtime's Prometheus metrics (``rollout_*``) and a small /metrics server.

Names, types and labels are the contract with docs/metrics.md, the dashboards and the alerts: do not rename.
Labels are bounded: outcomes, failure classes, exception class names and shard names, never a prompt or a
message. Metrics live on a registry the caller passes; the default is a fresh :class:`CollectorRegistry` so
that two dispatchers in one process (tests, a trainer that rebuilds its loop) never collide on the global one.
Pass ``prometheus_client.REGISTRY`` to expose them with everything else the process serves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ATTEMPT_OUTCOMES", "PROMPT_RESULTS", "MetricsServer", "RolloutMetrics", "serve_metrics"]

ATTEMPT_OUTCOMES = ("success", "infra_failure", "data_failure", "cancelled")
PROMPT_RESULTS = ("completed", "data_failed", "skipped")
STALL_ACTIONS = ("warn", "abort")

# Rollouts run from tens of milliseconds (a short completion) to many minutes (multi-turn agents).
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class RolloutMetrics:
    """Every ``rollout_*`` metric, registered once on ``registry``; label children pre-bound for the hot path."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.attempts_total = Counter(
            "rollout_attempts_total",
            "Rollout attempts by how they ended. A rising infra_failure or cancelled share means the fleet is "
            "sick (cancelled: the shard left the healthy set mid-attempt); data_failure means bad prompts.",
            ["outcome"],
            registry=r,
        )
        self.failures_total = Counter(
            "rollout_failures_total",
            "Failed rollout attempts by class (infra: redispatched; data: the prompt's fault) and exception type. "
            "Stacked by failure_type it shows which failure dominates.",
            ["failure_class", "failure_type"],
            registry=r,
        )
        self.redispatches_total = Counter(
            "rollout_redispatches_total",
            "Prompts sent back for another attempt after a failed or cancelled one. Its rate over the attempt "
            "rate is the share of work the fleet's failures cost.",
            registry=r,
        )
        self.redispatch_exhausted_total = Counter(
            "rollout_redispatch_exhausted_total",
            "Prompts that used up their infra budget (skipped, or the run ended). Any increase means "
            "fleet-wide failure, not a single bad shard.",
            registry=r,
        )
        self.stalls_total = Counter(
            "rollout_stalls_total",
            "Stall watchdog verdicts: prompts unfinished but nothing committed within the deadline. "
            "action=abort ended a run.",
            ["action"],
            registry=r,
        )
        self.prompts_total = Counter(
            "rollout_prompts_total",
            "Prompts by final result. data_failed is reported in the failure ledger, never trained on; "
            "skipped prompts exhausted their infra budget.",
            ["result"],
            registry=r,
        )
        self.in_flight = Gauge(
            "rollout_in_flight",
            "Rollout attempts currently running on shards. Flat and non-zero while "
            "rollout_last_commit_timestamp_seconds stops moving is a stall.",
            registry=r,
        )
        self.attempt_duration_seconds = Histogram(
            "rollout_attempt_duration_seconds",
            "Duration of rollout attempts on a shard, by outcome. A growing infra_failure tail means attempts "
            "hang until a timeout or probe catches them.",
            ["outcome"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.last_commit_timestamp_seconds = Gauge(
            "rollout_last_commit_timestamp_seconds",
            "Unix time a prompt last finished (completed or data-failed). time() minus this is how long the "
            "run has made no progress.",
            registry=r,
        )
        self.ejections_total = Counter(
            "rollout_ejections_total",
            "Passive ejections of a shard after an infra failure on it. A shard that keeps reappearing is "
            "flapping or sick in a way its probe does not see.",
            ["shard"],
            registry=r,
        )
        self.healthy_shards = Gauge(
            "rollout_healthy_shards",
            "Shards this runtime routes to: the healthy set it sees minus the shards it ejected. Below the "
            "fleet size means capacity is missing.",
            registry=r,
        )
        # Pre-bound children: .labels() costs a dict lookup and a lock; the hot path pays neither. They also
        # make every bounded series exist at zero, so rate() and alerts work before the first event.
        self.attempt_counter = {o: self.attempts_total.labels(outcome=o) for o in ATTEMPT_OUTCOMES}
        self.attempt_duration = {o: self.attempt_duration_seconds.labels(outcome=o) for o in ATTEMPT_OUTCOMES}
        self.prompt_counter = {p: self.prompts_total.labels(result=p) for p in PROMPT_RESULTS}
        self.stall_counter = {a: self.stalls_total.labels(action=a) for a in STALL_ACTIONS}

    def failure(self, failure_class: str, failure_type: str) -> None:
        self.failures_total.labels(failure_class=failure_class, failure_type=failure_type).inc()

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 when absent): for reports and tests."""
        found = self.registry.get_sample_value(name, labels or {})
        return 0.0 if found is None else found


@dataclass(frozen=True, slots=True)
class MetricsServer:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"


@asynccontextmanager
async def serve_metrics(
    registry: CollectorRegistry, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[MetricsServer]:
    """Serve ``registry`` at ``http://host:port/metrics`` on the running loop (port 0: any free port)."""

    async def handle(_: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        yield MetricsServer(host=host, port=int(bound))
    finally:
        await runner.cleanup()
