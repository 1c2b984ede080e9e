"""The router's own metrics (``router_*``), beside the dispatcher's ``rollout_*`` on the same registry.

Labels are bounded: the ``fleet`` and ``namespace`` the router follows (as on ``rollout_*``), the route (one of the
served paths), the status code, the refusal reason.

Every request updates them, so they are plain counts on this object, exposed at scrape time by a custom collector,
as the dispatcher's are (:mod:`rollout_runtime.metrics`): prometheus-client's ``Counter`` and ``Histogram`` take a
lock per increment and per bucket, on the path of every request the router relays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from rollout_runtime.metrics import FLEET_LABELS, BucketCounts, FamiliesCollector

__all__ = ["REFUSALS", "RouterMetrics"]

REFUSALS: Final[tuple[str, ...]] = ("malformed", "too_large", "busy", "no_healthy_shard")
"""Why the router answered without trying a shard (the ``reason`` label of ``router_refused_total``)."""

_BUCKETS: Final[tuple[float, ...]] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

_HELP: Final[dict[str, str]] = {
    "router_requests": "Requests answered, by route and HTTP status; a rate of non-2xx by code says who is failing "
    "whom.",
    "router_request_duration_seconds": "Time from a request's arrival to the end of its answer (a stream's last "
    "byte), by route.",
    "router_refused": "Requests answered without trying a shard: malformed (400), too_large (413), busy (429), "
    "no_healthy_shard (409).",
    "router_streams_interrupted": "Streams a shard broke after their first byte reached the client; each ended with "
    "an error event (the router's log names the shard, its ejections are rollout_ejections_total).",
    "router_in_flight_requests": "Requests being answered now.",
}


class RouterMetrics:
    """Declared once per router; ``registry`` is the one ``/metrics`` serves."""

    def __init__(self, registry: CollectorRegistry, *, fleet: str = "local", namespace: str = "") -> None:
        self.fixed = (fleet, namespace)
        self.requests: dict[tuple[str, str], int] = {}
        """Answers by (route, status code)."""
        self.durations: dict[str, BucketCounts] = {}
        """Answer durations by route."""
        self.refusals = dict.fromkeys(REFUSALS, 0)
        self.streams_interrupted = 0
        self.in_flight: Callable[[], float] = lambda: 0
        registry.register(_RouterCollector(self))

    def answered(self, route: str, code: int | str, seconds: float) -> None:
        key = (route, str(code))
        self.requests[key] = self.requests.get(key, 0) + 1
        durations = self.durations.get(route)
        if durations is None:  # bounded: the served routes
            durations = self.durations[route] = BucketCounts(_BUCKETS)
        durations.observe(seconds)

    def count_in_flight(self, read: Callable[[], float]) -> None:
        """``router_in_flight_requests`` reads ``read()`` at each scrape (the router keeps the only count)."""
        self.in_flight = read

    def refused(self, reason: str) -> None:
        self.refusals[reason] += 1

    def interrupted(self) -> None:
        self.streams_interrupted += 1


class _RouterCollector(FamiliesCollector):
    def __init__(self, metrics: RouterMetrics) -> None:
        self._m = metrics

    def families(self, *, samples: bool) -> list[Metric]:
        m = self._m
        requests = CounterMetricFamily(
            "router_requests_total", _HELP["router_requests"], labels=[*FLEET_LABELS, "route", "code"]
        )
        durations = HistogramMetricFamily(
            "router_request_duration_seconds", _HELP["router_request_duration_seconds"], labels=[*FLEET_LABELS, "route"]
        )
        refused = CounterMetricFamily("router_refused_total", _HELP["router_refused"], labels=[*FLEET_LABELS, "reason"])
        interrupted = CounterMetricFamily(
            "router_streams_interrupted_total", _HELP["router_streams_interrupted"], labels=FLEET_LABELS
        )
        in_flight = GaugeMetricFamily(
            "router_in_flight_requests", _HELP["router_in_flight_requests"], labels=FLEET_LABELS
        )
        families: list[Metric] = [requests, durations, refused, interrupted, in_flight]
        if not samples:
            return families
        fixed = list(m.fixed)
        for (route, code), count in list(m.requests.items()):
            requests.add_metric([*fixed, route, code], count)
        for route, counts in list(m.durations.items()):
            durations.add_metric([*fixed, route], counts.cumulative(), counts.sum)
        for reason, count in list(m.refusals.items()):
            refused.add_metric([*fixed, reason], count)
        interrupted.add_metric(fixed, m.streams_interrupted)
        in_flight.add_metric(fixed, m.in_flight())
        return families
