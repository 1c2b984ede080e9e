"""The router's metrics: plain counts, exposed at scrape time under prometheus-client's names, labels and bucket
bounds (the dashboards, alerts and recording rules read them)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from rollout_runtime.router.metrics import REFUSALS, RouterMetrics


def test_every_router_series_is_exposed_with_its_fleet_labels_and_counts() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, fleet="f", namespace="ns")
    for code, seconds in ((200, 0.003), (200, 0.2), (502, 1.5)):
        metrics.answered("/v1/completions", code, seconds)
    metrics.refused("busy")
    metrics.interrupted()
    metrics.count_in_flight(lambda: 7)

    fixed = {"fleet": "f", "namespace": "ns"}
    route = {**fixed, "route": "/v1/completions"}

    def value(name: str, labels: dict[str, str]) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("router_requests_total", {**route, "code": "200"}) == 2
    assert value("router_requests_total", {**route, "code": "502"}) == 1
    buckets = {le: value("router_request_duration_seconds_bucket", {**route, "le": le}) for le in ("0.005", "1.0")}
    assert buckets == {"0.005": 1, "1.0": 2}, "bounds spelled as prometheus-client's Histogram spells them"
    assert value("router_request_duration_seconds_bucket", {**route, "le": "+Inf"}) == 3
    assert value("router_request_duration_seconds_count", route) == 3
    assert value("router_request_duration_seconds_sum", route) == pytest.approx(1.703)
    refused = {reason: value("router_refused_total", {**fixed, "reason": reason}) for reason in REFUSALS}
    assert refused == {"malformed": 0, "too_large": 0, "busy": 1, "no_healthy_shard": 0}
    assert value("router_streams_interrupted_total", fixed) == 1
    assert value("router_in_flight_requests", fixed) == 7
