"""RolloutMetrics: the contract names and types, a private registry by default, and the /metrics server."""

from __future__ import annotations

import aiohttp
from prometheus_client import CollectorRegistry

from rollout_runtime.metrics import RolloutMetrics, serve_metrics

CONTRACT = {
    "rollout_attempts": ("counter", {"outcome"}),
    "rollout_failures": ("counter", {"failure_class", "failure_type"}),
    "rollout_redispatches": ("counter", set()),
    "rollout_redispatch_exhausted": ("counter", set()),
    "rollout_stalls": ("counter", {"action"}),
    "rollout_prompts": ("counter", {"result"}),
    "rollout_in_flight": ("gauge", set()),
    "rollout_attempt_duration_seconds": ("histogram", {"outcome"}),
    "rollout_last_commit_timestamp_seconds": ("gauge", set()),
    "rollout_ejections": ("counter", {"shard"}),
    "rollout_healthy_shards": ("gauge", set()),
}


def test_registers_exactly_the_contract_names_types_and_labels() -> None:
    metrics = RolloutMetrics()
    metrics.failure("infra", "GenerationUnavailable")
    metrics.ejection("a")
    found = {}
    for family in metrics.registry.collect():
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        found[family.name] = (family.type, labels)
    assert found == CONTRACT


def test_each_instance_gets_its_own_registry_so_two_dispatchers_never_collide() -> None:
    assert RolloutMetrics().registry is not RolloutMetrics().registry


def test_durations_land_in_cumulative_buckets_with_le_semantics() -> None:
    metrics = RolloutMetrics()
    for seconds in (0.01, 0.02, 3.0, 5000.0):
        metrics.attempt("success", seconds)
    bucket = "rollout_attempt_duration_seconds_bucket"
    assert metrics.value(bucket, {"outcome": "success", "le": "0.01"}) == 1, "a value equal to a bound is in it"
    assert metrics.value(bucket, {"outcome": "success", "le": "0.05"}) == 2
    assert metrics.value(bucket, {"outcome": "success", "le": "5.0"}) == 3
    assert metrics.value(bucket, {"outcome": "success", "le": "+Inf"}) == 4
    assert metrics.value("rollout_attempt_duration_seconds_count", {"outcome": "success"}) == 4
    assert metrics.value("rollout_attempt_duration_seconds_sum", {"outcome": "success"}) == 5003.03
    assert metrics.value("rollout_attempts_total", {"outcome": "success"}) == 4


def test_bounded_series_exist_at_zero_before_any_event() -> None:
    metrics = RolloutMetrics(CollectorRegistry())
    for outcome in ("success", "infra_failure", "data_failure", "cancelled"):
        assert metrics.registry.get_sample_value("rollout_attempts_total", {"outcome": outcome}) == 0
    for result in ("completed", "data_failed", "skipped"):
        assert metrics.registry.get_sample_value("rollout_prompts_total", {"result": result}) == 0


def test_in_flight_is_read_from_the_registered_counts_until_each_is_withdrawn() -> None:
    """rollout_in_flight keeps no count of its own: it sums the dispatchers' counts at scrape time."""
    metrics = RolloutMetrics()
    counts = {"first": 2, "second": 3}
    withdraw_first = metrics.count_in_flight(lambda: counts["first"])
    metrics.count_in_flight(lambda: counts["second"])
    assert metrics.value("rollout_in_flight") == 5
    counts["second"] = 1
    assert metrics.value("rollout_in_flight") == 3
    withdraw_first()
    assert metrics.value("rollout_in_flight") == 1


async def test_serve_metrics_exposes_the_registry_over_http() -> None:
    metrics = RolloutMetrics()
    metrics.prompts["completed"] += 3
    async with serve_metrics(metrics.registry) as server, aiohttp.ClientSession() as session:
        assert server.port > 0
        async with session.get(server.url) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            body = await response.text()
    assert 'rollout_prompts_total{result="completed"} 3.0' in body
    assert "# HELP rollout_attempts_total" in body
