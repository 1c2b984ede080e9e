"""environment_* metrics: exactly the contract names, on the registry the caller passes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from rollout_runtime.environment import EnvironmentMetrics

CONTRACT = {
    "environment_episodes_total": ("counter", {"outcome"}),
    "environment_episode_duration_seconds": ("histogram", {"outcome"}),
    "environment_cleanup_failures_total": ("counter", set()),
    "environment_dependency_failures_total": ("counter", {"retryable"}),
    "environment_episodes_in_flight": ("gauge", set()),
    "environment_admission_queue_depth": ("gauge", set()),
    "environment_duplicate_attempts_total": ("counter", {"action"}),
    "environment_episode_attempts_waiting": ("gauge", set()),
    "environment_checkpoint_store_failures_total": ("counter", {"operation"}),
}


def _families(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    found: dict[str, tuple[str, set[str]]] = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        found[name] = (family.type, labels)
    return found


def test_exactly_the_contract_metrics_are_registered_on_the_given_registry() -> None:
    registry = CollectorRegistry()
    EnvironmentMetrics(registry)
    assert _families(registry) == CONTRACT


def test_every_label_value_exists_from_the_start_at_zero() -> None:
    metrics = EnvironmentMetrics()
    for outcome in ("success", "failed", "timeout", "rejected"):
        assert metrics.registry.get_sample_value("environment_episodes_total", {"outcome": outcome}) == 0
    for retryable in ("true", "false"):
        value = metrics.registry.get_sample_value("environment_dependency_failures_total", {"retryable": retryable})
        assert value == 0


def test_two_servers_in_one_process_do_not_collide_by_default() -> None:
    first, second = EnvironmentMetrics(), EnvironmentMetrics()
    first.episode_finished("success", 1.5)
    assert first.registry is not second.registry
    assert second.registry.get_sample_value("environment_episodes_total", {"outcome": "success"}) == 0


def test_registering_twice_on_one_registry_fails_loudly() -> None:
    registry = CollectorRegistry()
    EnvironmentMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        EnvironmentMetrics(registry)


def test_finished_episodes_are_counted_and_timed_by_outcome() -> None:
    metrics = EnvironmentMetrics()
    metrics.episode_finished("timeout", 600.0)
    metrics.dependency_failed(retryable=False)
    registry = metrics.registry
    assert registry.get_sample_value("environment_episodes_total", {"outcome": "timeout"}) == 1
    assert registry.get_sample_value("environment_episode_duration_seconds_sum", {"outcome": "timeout"}) == 600.0
    assert registry.get_sample_value("environment_dependency_failures_total", {"retryable": "false"}) == 1
