"""The operator's Prometheus metrics (``fleet_*``): the contract with docs/metrics.md, dashboards and alerts.

Labels are bounded: kinds, phases, probe failure reasons (a fixed enum) and object names (the series of a deleted
object are removed with it). Metrics live on a registry the caller passes (default: a fresh one).
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["FleetMetrics"]

# Probes are bounded by their timeout (default 2 s); most healthy answers take milliseconds.
_PROBE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)


class FleetMetrics:
    """Every ``fleet_*`` metric, registered once on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.shard_healthy = Gauge(
            "fleet_shard_healthy",
            "1 while the target is in its fleets' healthy set (Healthy or Suspect, not draining), else 0. "
            "A target flapping between 0 and 1 needs a look at its probes' failure reasons.",
            ["namespace", "kind", "name"],
            registry=r,
        )
        self.probe_duration_seconds = Histogram(
            "fleet_probe_duration_seconds",
            "Duration of active health probes (failed ones included, bounded by the probe timeout). A rising "
            "p99 near the timeout predicts timeouts and Unhealthy transitions.",
            ["kind"],
            buckets=_PROBE_BUCKETS,
            registry=r,
        )
        self.probe_failures_total = Counter(
            "fleet_probe_failures_total",
            "Failed probes by reason (connect, timeout, status, redirect, wrong_model, malformed, too_large, "
            "forbidden_target, error). forbidden_target means a resource points outside the probe allowlist.",
            ["kind", "reason"],
            registry=r,
        )
        self.healthy_shards = Gauge(
            "fleet_healthy_shards",
            "Generation shards in the fleet's published healthy set. Compare with fleet_shards: the gap is "
            "capacity the trainer cannot use.",
            ["namespace", "fleet"],
            registry=r,
        )
        self.shards = Gauge(
            "fleet_shards",
            "Generation shards the fleet selects (healthy or not).",
            ["namespace", "fleet"],
            registry=r,
        )
        self.health_transitions_total = Counter(
            "fleet_health_transitions_total",
            "Health phase changes of shards and environment servers. A high rate of Healthy->Suspect without "
            "Unhealthy is probe noise; Unhealthy transitions are outages.",
            ["kind", "from_phase", "to_phase"],
            registry=r,
        )
        self.status_writes_total = Counter(
            "fleet_status_writes_total",
            "Status writes to the API server by kind. Transitions plus one heartbeat per target per interval; "
            "a rate far above that means write coalescing is broken.",
            ["kind"],
            registry=r,
        )

    def clear_state(self) -> None:
        """Drop every state gauge when a leadership term ends.

        A standby's view is not the fleet's: alerts aggregate replicas with ``max by``, so a stale "2 healthy" left
        by a former leader would hide the new leader's "0 healthy". Counters stay: they are history, not state.
        """
        for gauge in (self.shard_healthy, self.healthy_shards, self.shards):
            gauge.clear()

    def forget_target(self, namespace: str, kind: str, name: str) -> None:
        """Drop a deleted target's series (keeps the label set bounded by live objects)."""
        with contextlib.suppress(KeyError):
            self.shard_healthy.remove(namespace, kind, name)

    def forget_fleet(self, namespace: str, fleet: str) -> None:
        for gauge in (self.healthy_shards, self.shards):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, fleet)
