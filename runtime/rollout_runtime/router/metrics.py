"""The router's own metrics (``router_*``), beside the dispatcher's ``rollout_*`` on the same registry.

Labels are bounded: the ``fleet`` and ``namespace`` the router follows (as on ``rollout_*``), the route (one of the
served paths), the status code, the refusal reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["REFUSALS", "RouterMetrics"]

REFUSALS: Final[tuple[str, ...]] = ("malformed", "too_large", "busy", "no_healthy_shard")
"""Why the router answered without trying a shard (the ``reason`` label of ``router_refused_total``)."""

_BUCKETS: Final[tuple[float, ...]] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_FIXED: Final[tuple[str, str]] = ("fleet", "namespace")


class RouterMetrics:
    """Declared once per router; ``registry`` is the one ``/metrics`` serves."""

    def __init__(self, registry: CollectorRegistry, *, fleet: str = "local", namespace: str = "") -> None:
        self._fixed = (fleet, namespace)
        self._requests = Counter(
            "router_requests",
            "Requests answered, by route and HTTP status; a rate of non-2xx by code says who is failing whom.",
            [*_FIXED, "route", "code"],
            registry=registry,
        )
        self._duration = Histogram(
            "router_request_duration_seconds",
            "Time from a request's arrival to the end of its answer (a stream's last byte), by route.",
            [*_FIXED, "route"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self._refused = Counter(
            "router_refused",
            "Requests answered without trying a shard: malformed (400), too_large (413), busy (429), "
            "no_healthy_shard (409).",
            [*_FIXED, "reason"],
            registry=registry,
        )
        self._interrupted = Counter(
            "router_streams_interrupted",
            "Streams a shard broke after their first byte reached the client; each ended with an error event (the "
            "router's log names the shard, its ejections are rollout_ejections_total).",
            _FIXED,
            registry=registry,
        ).labels(*self._fixed)
        self._in_flight = Gauge(
            "router_in_flight_requests", "Requests being answered now.", _FIXED, registry=registry
        ).labels(*self._fixed)
        self._answered: dict[tuple[str, int | str], tuple[Counter, Histogram]] = {}
        """The labelled children per (route, code), looked up once instead of per request."""
        for reason in REFUSALS:
            self._refused.labels(*self._fixed, reason)

    def answered(self, route: str, code: int | str, seconds: float) -> None:
        key = (route, code)
        children = self._answered.get(key)
        if children is None:  # bounded: a few routes times the status codes seen
            count = self._requests.labels(*self._fixed, route, str(code))
            children = self._answered[key] = (count, self._duration.labels(*self._fixed, route))
        children[0].inc()
        children[1].observe(seconds)

    def count_in_flight(self, read: Callable[[], float]) -> None:
        """``router_in_flight_requests`` reads ``read()`` at each scrape (no lock taken per request)."""
        self._in_flight.set_function(read)

    def refused(self, reason: str) -> None:
        self._refused.labels(*self._fixed, reason).inc()

    def interrupted(self) -> None:
        self._interrupted.inc()
