"""The runtime's Prometheus metrics (``rollout_*``) and a small /metrics server.

Names, types and labels are the contract with docs/metrics.md, the dashboards and the alerts: do not rename.
Labels are bounded: outcomes, failure classes, exception class names and shard names, never a prompt or a
message. Every sample also carries the constant labels ``fleet`` and ``namespace``: the RolloutFleet the dispatcher
follows (from its shard source, see :func:`rollout_runtime.shards.fleet_identity`), so dashboards and alerts can
tell one trainer's fleets apart without relying on scrape-target labels. One value each per instance: they add no
series, they only name the ones there are.

The dispatcher updates these on every attempt, so the hot path is plain arithmetic on this object's fields and
the exposition happens at scrape time, in a custom collector (prometheus-client's documented pattern for state
that lives elsewhere). With ``Counter``/``Histogram`` objects each attempt paid four locked increments, which
was a third of the dispatcher's whole per-attempt cost (see bench/dispatch_overhead.py). Updates come from one
event loop thread; a scrape from another thread reads a consistent-enough view (each value is read atomically).
``rollout_in_flight`` is not kept here at all: it is read from the dispatchers' own counts (:meth:`count_in_flight`).

Metrics live on a registry the caller passes; the default is a fresh :class:`CollectorRegistry`, so two
dispatchers in one process (tests, a trainer that rebuilds its loop) never collide on the global one. Pass
``prometheus_client.REGISTRY`` to expose them with everything else the process serves.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from rollout_runtime.serving import exposition, serve_app
from rollout_runtime.shards.model import DEFAULT_FLEET

__all__ = [
    "ATTEMPT_OUTCOMES",
    "DEFAULT_FLEET",
    "FLEET_LABELS",
    "PROMPT_RESULTS",
    "QUALITY_SIGNALS",
    "STALL_ACTIONS",
    "BucketCounts",
    "FamiliesCollector",
    "MetricsServer",
    "RolloutMetrics",
    "serve_metrics",
]

ATTEMPT_OUTCOMES = ("success", "infra_failure", "data_failure", "cancelled", "stale")
PROMPT_RESULTS = ("completed", "data_failed", "skipped")
STALL_ACTIONS = ("warn", "abort")
QUALITY_SIGNALS = ("empty", "odd_finish", "length", "logprob", "mismatch")
"""``dispatch.quality.SIGNALS``, spelled out here because that package imports this module (a test keeps them equal)."""
FLEET_LABELS = ("fleet", "namespace")
"""Constant labels on every ``rollout_*`` sample, in this order."""

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Rollouts run from tens of milliseconds (a short completion) to many minutes (multi-turn agents)."""

_HELP = {
    "rollout_attempts": "Rollout attempts by how they ended. A rising infra_failure or cancelled share means the fleet "
    "is sick (cancelled: the shard left the healthy set mid-attempt); data_failure means bad prompts.",
    "rollout_failures": "Failed rollout attempts by class (infra: redispatched; data: the prompt's fault) and "
    "exception type. Stacked by failure_type it shows which failure dominates.",
    "rollout_redispatches": "Prompts sent back for another attempt after a failed or cancelled one. Its rate over "
    "the attempt rate is the share of work the fleet's failures cost.",
    "rollout_redispatch_exhausted": "Prompts that used up their infra budget (skipped, or the run ended). Any "
    "increase means fleet-wide failure, not a single bad shard.",
    "rollout_stalls": "Stall watchdog verdicts: prompts unfinished but nothing committed within the deadline. "
    "action=abort ended a run.",
    "rollout_prompts": "Prompts by final result. data_failed is reported in the failure ledger, never trained on; "
    "skipped prompts exhausted their infra budget.",
    "rollout_in_flight": "Rollout attempts currently running on shards. Flat and non-zero while "
    "rollout_last_commit_timestamp_seconds stops moving is a stall.",
    "rollout_attempt_duration_seconds": "Duration of rollout attempts on a shard, by outcome. A growing "
    "infra_failure tail means attempts hang until a timeout or probe catches them.",
    "rollout_last_commit_timestamp_seconds": "Unix time a prompt last finished (completed or data-failed), or the "
    "first run started. time() minus this is how long the run has made no progress.",
    "rollout_ejections": "Passive ejections of a shard after an infra failure on it. A shard that keeps reappearing "
    "is flapping or sick in a way its probe does not see.",
    "rollout_shard_holds": "Failures after which the ejection cap (max_ejection_percent) kept a shard in rotation, "
    "so it was held instead (until a passing probe past the backoff). A steady rate means correlated failures on "
    "more shards than the cap lets out.",
    "rollout_shard_quarantines": "Shards taken out of rotation because their outputs, though answered 200, differ "
    "from those of their peers on the same weights version (signal: empty, odd_finish, length, logprob, mismatch). "
    "Any increase is a gray failure: see the ShardQuarantined event's evidence.",
    "rollout_committed_results": "Committed results by how many policy versions the producing shard lagged the "
    "trainer (lag=unknown: weights not tracked). Anything but lag=0 with max_weights_lag 0 is a bug.",
    "rollout_shard_stale": "1 while a shard is Stale or Refitting (restarted since its last refit, or being refit): "
    "it gets no traffic. One staying 1 past the refit timeout is a trainer that does not refit it.",
    "rollout_stale_shards": "Shards Stale or Refitting now (the sum of rollout_shard_stale).",
    "rollout_healthy_shards": "Shards this runtime routes to: the healthy set it sees minus the shards it ejected. "
    "Below the fleet size means capacity is missing.",
}


class BucketCounts:
    """A histogram's state for one label value, exposed by a custom collector; ``observe`` is a bisect and two
    additions (prometheus-client's ``Histogram.observe`` takes a lock per bucket it touches)."""

    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...] = DURATION_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """``(upper bound, count at or below it)`` per bucket, +Inf last: ``HistogramMetricFamily``'s form, the bounds
        spelled as prometheus-client's ``Histogram`` spells them (``le="1.0"``, not ``"1"``)."""
        total = 0
        out: list[tuple[str, float]] = []
        for bound, count in zip((*map(floatToGoString, self.buckets), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


class RolloutMetrics:
    """Every ``rollout_*`` metric; the dispatcher updates the fields, a collector on ``registry`` exposes them.

    ``fleet`` and ``namespace`` label every sample (``namespace`` empty, i.e. absent in Prometheus, for fleets that
    live outside Kubernetes).
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, fleet: str = DEFAULT_FLEET, namespace: str = ""
    ) -> None:
        if not fleet:
            raise ValueError("fleet must be a non-empty name")
        self.fleet = fleet
        self.namespace = namespace
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.attempts = dict.fromkeys(ATTEMPT_OUTCOMES, 0)
        self.durations = {outcome: BucketCounts() for outcome in ATTEMPT_OUTCOMES}
        self.failures: dict[tuple[str, str], int] = {}
        self.prompts = dict.fromkeys(PROMPT_RESULTS, 0)
        self.stalls = dict.fromkeys(STALL_ACTIONS, 0)
        self.ejections: dict[str, int] = {}
        self.holds: dict[str, int] = {}
        self.quarantines: dict[tuple[str, str], int] = {}
        self.redispatches = 0
        self.exhausted = 0
        self.healthy_shards = 0
        self.committed_by_lag: dict[str, int] = {}
        self.stale_shards: Callable[[], Mapping[str, bool]] | None = None
        """Read at scrape time (the dispatcher points it at its weights view)."""
        self.last_commit_timestamp: float | None = None
        self._in_flight_sources: list[Callable[[], int]] = []
        self.registry.register(_RolloutCollector(self))

    @property
    def in_flight(self) -> int:
        """Attempts running now: the sum of the counts registered with :meth:`count_in_flight`."""
        return sum(source() for source in tuple(self._in_flight_sources))

    def count_in_flight(self, source: Callable[[], int]) -> Callable[[], None]:
        """Expose ``source()`` (a dispatcher's attempts in flight) in ``rollout_in_flight``; returns the undo.

        Read at scrape time, so the dispatcher keeps the only count and the gauge cannot drift from it.
        """
        self._in_flight_sources.append(source)
        return lambda: self._in_flight_sources.remove(source)

    def attempt(self, outcome: str, seconds: float | None = None) -> None:
        """An attempt ended; ``seconds`` is None when it never reached a shard (no duration to observe)."""
        self.attempts[outcome] += 1
        if seconds is not None:
            self.durations[outcome].observe(seconds)

    def failure(self, failure_class: str, failure_type: str) -> None:
        key = (failure_class, failure_type)
        self.failures[key] = self.failures.get(key, 0) + 1

    def committed(self, lag: str) -> None:
        """A result was committed at ``lag`` (a :func:`~rollout_runtime.weights.lag_label` value)."""
        self.committed_by_lag[lag] = self.committed_by_lag.get(lag, 0) + 1

    def ejection(self, shard: str) -> None:
        self.ejections[shard] = self.ejections.get(shard, 0) + 1

    def hold(self, shard: str) -> None:
        self.holds[shard] = self.holds.get(shard, 0) + 1

    def quarantine(self, shard: str, signal: str) -> None:
        key = (shard, signal)
        self.quarantines[key] = self.quarantines.get(key, 0) + 1

    def shard_joined(self, shard: str) -> None:
        """``shard`` joined the healthy set: its holds and quarantines series start at 0, so a panel shows "none"
        rather than no data and an alert's ``increase()`` sees the first one (both are rare; ejections are not
        pre-seeded, a dashboard sees them in any real run)."""
        self.holds.setdefault(shard, 0)
        for signal in QUALITY_SIGNALS:
            self.quarantines.setdefault((shard, signal), 0)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value as exposed (0 when absent): for reports and tests.

        ``labels`` are the metric's own; this instance's ``fleet`` and ``namespace`` are added to them.
        """
        found = self.registry.get_sample_value(
            name, {"fleet": self.fleet, "namespace": self.namespace, **(labels or {})}
        )
        return 0.0 if found is None else found


class FamiliesCollector(Collector):
    """A custom collector over state kept elsewhere: :meth:`families` builds every family, without samples for
    ``describe`` (the registry's check for duplicate names) and with them at each scrape."""

    def describe(self) -> Iterator[Metric]:
        return iter(self.families(samples=False))

    def collect(self) -> Iterator[Metric]:
        return iter(self.families(samples=True))

    def families(self, *, samples: bool) -> list[Metric]:
        raise NotImplementedError


class _RolloutCollector(FamiliesCollector):
    def __init__(self, metrics: RolloutMetrics) -> None:
        self._m = metrics

    def families(self, *, samples: bool) -> list[Metric]:
        m = self._m
        attempts = CounterMetricFamily(
            "rollout_attempts_total", _HELP["rollout_attempts"], labels=[*FLEET_LABELS, "outcome"]
        )
        failures = CounterMetricFamily(
            "rollout_failures_total", _HELP["rollout_failures"], labels=[*FLEET_LABELS, "failure_class", "failure_type"]
        )
        redispatches = CounterMetricFamily(
            "rollout_redispatches_total", _HELP["rollout_redispatches"], labels=FLEET_LABELS
        )
        exhausted = CounterMetricFamily(
            "rollout_redispatch_exhausted_total", _HELP["rollout_redispatch_exhausted"], labels=FLEET_LABELS
        )
        stalls = CounterMetricFamily("rollout_stalls_total", _HELP["rollout_stalls"], labels=[*FLEET_LABELS, "action"])
        prompts = CounterMetricFamily(
            "rollout_prompts_total", _HELP["rollout_prompts"], labels=[*FLEET_LABELS, "result"]
        )
        in_flight = GaugeMetricFamily("rollout_in_flight", _HELP["rollout_in_flight"], labels=FLEET_LABELS)
        durations = HistogramMetricFamily(
            "rollout_attempt_duration_seconds",
            _HELP["rollout_attempt_duration_seconds"],
            labels=[*FLEET_LABELS, "outcome"],
        )
        last_commit = GaugeMetricFamily(
            "rollout_last_commit_timestamp_seconds", _HELP["rollout_last_commit_timestamp_seconds"], labels=FLEET_LABELS
        )
        ejections = CounterMetricFamily(
            "rollout_ejections_total", _HELP["rollout_ejections"], labels=[*FLEET_LABELS, "shard"]
        )
        holds = CounterMetricFamily(
            "rollout_shard_holds_total", _HELP["rollout_shard_holds"], labels=[*FLEET_LABELS, "shard"]
        )
        quarantines = CounterMetricFamily(
            "rollout_shard_quarantines_total",
            _HELP["rollout_shard_quarantines"],
            labels=[*FLEET_LABELS, "shard", "signal"],
        )
        healthy = GaugeMetricFamily("rollout_healthy_shards", _HELP["rollout_healthy_shards"], labels=FLEET_LABELS)
        committed = CounterMetricFamily(
            "rollout_committed_results", _HELP["rollout_committed_results"], labels=[*FLEET_LABELS, "lag"]
        )
        shard_stale = GaugeMetricFamily(
            "rollout_shard_stale", _HELP["rollout_shard_stale"], labels=[*FLEET_LABELS, "shard"]
        )
        stale_shards = GaugeMetricFamily("rollout_stale_shards", _HELP["rollout_stale_shards"], labels=FLEET_LABELS)
        families: list[Metric] = [
            committed,
            shard_stale,
            stale_shards,
            attempts,
            failures,
            redispatches,
            exhausted,
            stalls,
            prompts,
            in_flight,
            durations,
            last_commit,
            ejections,
            holds,
            quarantines,
            healthy,
        ]
        if not samples:
            return families
        fixed = [m.fleet, m.namespace]
        for outcome, count in list(m.attempts.items()):
            attempts.add_metric([*fixed, outcome], count)
        for (failure_class, failure_type), count in list(m.failures.items()):
            failures.add_metric([*fixed, failure_class, failure_type], count)
        redispatches.add_metric(fixed, m.redispatches)
        exhausted.add_metric(fixed, m.exhausted)
        for action, count in list(m.stalls.items()):
            stalls.add_metric([*fixed, action], count)
        for result, count in list(m.prompts.items()):
            prompts.add_metric([*fixed, result], count)
        in_flight.add_metric(fixed, m.in_flight)
        for outcome, histogram in list(m.durations.items()):
            durations.add_metric([*fixed, outcome], histogram.cumulative(), histogram.sum)
        last_commit.add_metric(fixed, m.last_commit_timestamp or 0.0)
        for shard, count in list(m.ejections.items()):
            ejections.add_metric([*fixed, shard], count)
        for shard, count in list(m.holds.items()):
            holds.add_metric([*fixed, shard], count)
        for (shard, signal), count in list(m.quarantines.items()):
            quarantines.add_metric([*fixed, shard, signal], count)
        healthy.add_metric(fixed, m.healthy_shards)
        for lag, count in list(m.committed_by_lag.items()):
            committed.add_metric([*fixed, lag], count)
        stale = dict(m.stale_shards()) if m.stale_shards is not None else {}
        for shard, is_stale in sorted(stale.items()):
            shard_stale.add_metric([*fixed, shard], 1.0 if is_stale else 0.0)
        stale_shards.add_metric(fixed, sum(stale.values()))
        return families


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
        return exposition(registry)

    app = web.Application()
    app.router.add_get("/metrics", handle)
    async with serve_app(app, host=host, port=port, access_log=None) as bound:
        yield MetricsServer(host=host, port=bound)
