"""RolloutMetrics: the contract names and types, a private registry by default, and the /metrics server."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from rollout_runtime.dispatch import Dispatcher
from rollout_runtime.metrics import RolloutMetrics, serve_metrics
from rollout_runtime.shards import KubernetesShardSource, LocalShardSource, Shard, StaticShardSource

FLEET = {"fleet", "namespace"}
CONTRACT = {
    "rollout_attempts": ("counter", FLEET | {"outcome"}),
    "rollout_failures": ("counter", FLEET | {"failure_class", "failure_type"}),
    "rollout_redispatches": ("counter", FLEET),
    "rollout_redispatch_exhausted": ("counter", FLEET),
    "rollout_stalls": ("counter", FLEET | {"action"}),
    "rollout_prompts": ("counter", FLEET | {"result"}),
    "rollout_in_flight": ("gauge", FLEET),
    "rollout_attempt_duration_seconds": ("histogram", FLEET | {"outcome"}),
    "rollout_last_commit_timestamp_seconds": ("gauge", FLEET),
    "rollout_ejections": ("counter", FLEET | {"shard"}),
    "rollout_shard_holds": ("counter", FLEET | {"shard"}),
    "rollout_shard_quarantines": ("counter", FLEET | {"shard", "signal"}),
    "rollout_healthy_shards": ("gauge", FLEET),
    "rollout_committed_results": ("counter", FLEET | {"lag"}),
    "rollout_shard_stale": ("gauge", FLEET | {"shard"}),
    "rollout_stale_shards": ("gauge", FLEET),
}
LOCAL = {"fleet": "local", "namespace": ""}


def test_registers_exactly_the_contract_names_types_and_labels() -> None:
    metrics = RolloutMetrics()
    metrics.failure("infra", "GenerationUnavailable")
    metrics.ejection("a")
    metrics.hold("a")
    metrics.quarantine("a", "empty")
    metrics.committed("0")
    metrics.stale_shards = lambda: {"a": True}
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
        assert metrics.registry.get_sample_value("rollout_attempts_total", {**LOCAL, "outcome": outcome}) == 0
    for result in ("completed", "data_failed", "skipped"):
        assert metrics.registry.get_sample_value("rollout_prompts_total", {**LOCAL, "result": result}) == 0


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
    assert 'rollout_prompts_total{fleet="local",namespace="",result="completed"} 3.0' in body
    assert "# HELP rollout_attempts_total" in body


def test_every_sample_carries_the_fleet_and_namespace_it_was_created_for() -> None:
    metrics = RolloutMetrics(fleet="fleet-a", namespace="team-a")
    metrics.failure("infra", "GenerationUnavailable")
    metrics.ejection("a")
    metrics.attempt("success", 0.2)
    for family in metrics.registry.collect():
        for sample in family.samples:
            assert (sample.labels["fleet"], sample.labels["namespace"]) == ("fleet-a", "team-a"), sample
    assert metrics.value("rollout_attempts_total", {"outcome": "success"}) == 1, "value() fills in the fleet labels"


def test_an_empty_fleet_name_is_refused() -> None:
    with pytest.raises(ValueError, match="fleet"):
        RolloutMetrics(fleet="")


SHARD = Shard(name="a", endpoint="http://127.0.0.1:1")


@pytest.mark.parametrize(
    ("source", "labels"),
    [
        (StaticShardSource([SHARD]), ("local", "")),
        (StaticShardSource([SHARD], fleet="bench"), ("bench", "")),
        (LocalShardSource([SHARD], fleet="lab"), ("lab", "")),
        (KubernetesShardSource("fleet-a", namespace="team-a", api_client=object()), ("fleet-a", "team-a")),  # type: ignore[arg-type]
    ],
    ids=["static-default", "static-named", "local-named", "kubernetes"],
)
def test_the_dispatcher_labels_its_metrics_with_its_sources_fleet(source: object, labels: tuple[str, str]) -> None:
    dispatcher = Dispatcher(source)  # type: ignore[arg-type]
    assert (dispatcher.metrics.fleet, dispatcher.metrics.namespace) == labels


def test_metrics_the_caller_passes_keep_their_own_labels() -> None:
    mine = RolloutMetrics(fleet="mine")
    assert Dispatcher(StaticShardSource([SHARD], fleet="other"), metrics=mine).metrics is mine
