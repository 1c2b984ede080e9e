"""The router's own metrics (``router_*``), beside the dispatcher's ``rollout_*`` on the same registry.

Labels are bounded: the route (one of the served paths), the status code, the refusal reason, the shard name.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["REFUSALS", "RouterMetrics"]

REFUSALS: Final[tuple[str, ...]] = ("malformed", "too_large", "busy", "no_healthy_shard")
"""Why the router answered without trying a shard (the ``reason`` label of ``router_refused_total``)."""

_BUCKETS: Final[tuple[float, ...]] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class RouterMetrics:
    """Declared once per router; ``registry`` is the one ``/metrics`` serves."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "router_requests",
            "Requests answered, by route and HTTP status; a rate of non-2xx by code says who is failing whom.",
            ["route", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "router_request_duration_seconds",
            "Time from a request's arrival to the end of its answer (a stream's last byte), by route.",
            ["route"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.refused = Counter(
            "router_refused",
            "Requests answered without trying a shard: malformed (400), too_large (413), busy (429), "
            "no_healthy_shard (409).",
            ["reason"],
            registry=registry,
        )
        self.interrupted = Counter(
            "router_streams_interrupted",
            "Streams a shard broke after their first byte reached the client; each ended with an error event.",
            ["shard"],
            registry=registry,
        )
        self.in_flight = Gauge("router_in_flight_requests", "Requests being answered now.", registry=registry)
        for reason in REFUSALS:
            self.refused.labels(reason)
