"""The operator registers exactly the fleet_* metrics TEAM.md and docs/metrics.md name, with their labels."""

from __future__ import annotations

import re
from pathlib import Path

from fleet_operator.metrics import FleetMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
EXPECTED = {
    "fleet_shard_healthy": ("gauge", {"namespace", "kind", "name"}),
    "fleet_probe_duration_seconds": ("histogram", {"kind"}),
    "fleet_probe_failures_total": ("counter", {"kind", "reason"}),
    "fleet_healthy_shards": ("gauge", {"namespace", "fleet"}),
    "fleet_shards": ("gauge", {"namespace", "fleet"}),
    "fleet_health_transitions_total": ("counter", {"kind", "from_phase", "to_phase"}),
    "fleet_status_writes_total": ("counter", {"kind"}),
}


def registered() -> dict[str, tuple[str, set[str]]]:
    metrics = FleetMetrics()
    found = {}
    for metric in metrics.registry.collect():
        name = metric.name + ("_total" if metric.type == "counter" else "")
        found[name] = (metric.type, set(getattr(metrics, _attr(name))._labelnames))
    return found


def _attr(name: str) -> str:
    return {
        "fleet_shard_healthy": "shard_healthy",
        "fleet_probe_duration_seconds": "probe_duration_seconds",
        "fleet_probe_failures_total": "probe_failures_total",
        "fleet_healthy_shards": "healthy_shards",
        "fleet_shards": "shards",
        "fleet_health_transitions_total": "health_transitions_total",
        "fleet_status_writes_total": "status_writes_total",
    }[name]


def test_registered_metrics_are_exactly_the_contract() -> None:
    assert registered() == EXPECTED


def test_docs_operator_section_documents_exactly_the_registered_metrics() -> None:
    text = DOCS.read_text()
    section = text.split("## Operator", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(fleet_[a-z_]+)`", section, flags=re.MULTILINE))
    assert documented == set(EXPECTED)


def test_a_deleted_targets_series_is_removed() -> None:
    metrics = FleetMetrics()
    metrics.shard_healthy.labels("ns", "GenerationShard", "s1").set(1)
    metrics.forget_target("ns", "GenerationShard", "s1")
    metrics.forget_target("ns", "GenerationShard", "never-seen")
    assert (
        metrics.registry.get_sample_value(
            "fleet_shard_healthy", {"namespace": "ns", "kind": "GenerationShard", "name": "s1"}
        )
        is None
    )


def test_a_former_leader_exports_no_fleet_state() -> None:
    """After a leadership term the state gauges are gone (a stale 'healthy' must not mask the new leader's 0)."""
    metrics = FleetMetrics()
    metrics.shard_healthy.labels("ns", "GenerationShard", "a").set(1)
    metrics.healthy_shards.labels("ns", "fleet").set(2)
    metrics.shards.labels("ns", "fleet").set(2)
    metrics.status_writes_total.labels("GenerationShard").inc()
    metrics.clear_state()
    r = metrics.registry
    assert r.get_sample_value("fleet_healthy_shards", {"namespace": "ns", "fleet": "fleet"}) is None
    assert r.get_sample_value("fleet_shards", {"namespace": "ns", "fleet": "fleet"}) is None
    shard = {"namespace": "ns", "kind": "GenerationShard", "name": "a"}
    assert r.get_sample_value("fleet_shard_healthy", shard) is None
    assert r.get_sample_value("fleet_status_writes_total", {"kind": "GenerationShard"}) == 1
