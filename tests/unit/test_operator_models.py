"""The pydantic models reject what the CRD's CEL rules reject, and default what the CRD defaults."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleet_operator.crds import KINDS, render_crd
from fleet_operator.models import (
    DispatchPolicySpec,
    EnvironmentServerSpec,
    GenerationShardSpec,
    LabelSelectorRequirement,
    ProbeSpec,
    RolloutFleetSpec,
)
from rollout_runtime.health import HealthState, ProbeSettings


def _rules(kind: str) -> list[str]:
    """Every CEL rule in a kind's schema, as text."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found.extend(rule["rule"] for rule in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(render_crd(next(k for k in KINDS if k.kind == kind)))
    return found


def test_probe_defaults_follow_the_design() -> None:
    probe = GenerationShardSpec(endpoint="http://10.0.0.7:8000").probe
    assert (probe.path, probe.period_seconds, probe.timeout_seconds) == ("/health", 5.0, 2.0)
    assert (probe.failure_threshold, probe.success_threshold) == (3, 2)


def test_probe_spec_is_the_runtime_probe_settings_so_hysteresis_takes_it_directly() -> None:
    probe = ProbeSpec(period_seconds=1, timeout_seconds=0.5, failure_threshold=1)
    assert isinstance(probe, ProbeSettings)
    assert HealthState(probe).settings.failure_threshold == 1


def test_camel_case_on_the_wire_and_unset_optionals_omitted() -> None:
    spec = GenerationShardSpec.model_validate(
        {"serviceRef": {"name": "vllm-0"}, "maxModelLen": 4096, "probe": {"periodSeconds": 10}}
    )
    wire = spec.to_kube()
    assert wire["serviceRef"] == {"name": "vllm-0", "port": 8000, "scheme": "http"}
    assert wire["maxModelLen"] == 4096
    assert wire["probe"]["periodSeconds"] == 10
    assert "endpoint" not in wire


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "exactly one of spec.serviceRef"),
        ({"endpoint": "http://a:1", "serviceRef": {"name": "a"}}, "exactly one of spec.serviceRef"),
        ({"endpoint": "ftp://a:1"}, "endpoint"),
        ({"endpoint": "http://a:1/?x=1"}, "endpoint"),
        ({"endpoint": "http://a:1", "probe": {"periodSeconds": 1, "timeoutSeconds": 1}}, "less than period"),
        ({"endpoint": "http://a:1", "probe": {"failureThreshold": 0}}, "greater than or equal to 1"),
        ({"endpoint": "http://a:1", "probe": {"path": "health"}}, "path"),
        ({"endpoint": "http://a:1", "weight": 0}, "greater than 0"),
    ],
)
def test_bad_shard_specs_are_rejected_by_pydantic(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GenerationShardSpec.model_validate(spec)


def test_environment_server_shares_the_location_rule() -> None:
    with pytest.raises(ValidationError, match=r"exactly one of spec\.serviceRef"):
        EnvironmentServerSpec.model_validate({"protocol": "episode-v1"})
    assert EnvironmentServerSpec(endpoint="http://env:9000", max_concurrent_episodes=8).max_concurrent_episodes == 8


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"stallDeadlineSeconds": 100, "attemptTimeoutSeconds": 100}, "stallDeadlineSeconds must be greater"),
        ({"stallCheckSeconds": 700}, "stallCheckSeconds must not exceed"),
        ({"ejectionBaseSeconds": 10, "ejectionMaxSeconds": 5}, "ejectionMaxSeconds must be at least"),
        ({"backoffInitialSeconds": 10, "backoffMaxSeconds": 5}, "backoffMaxSeconds must be at least"),
        ({"maxInfraAttempts": 0}, "greater than or equal to 1"),
        ({"stallAction": "explode"}, "warn"),
    ],
)
def test_bad_policies_are_rejected_by_pydantic(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DispatchPolicySpec.model_validate(policy)


def test_selector_expressions_need_values_exactly_for_in_and_notin() -> None:
    with pytest.raises(ValidationError, match="need at least one value"):
        LabelSelectorRequirement(key="a", operator="In")
    with pytest.raises(ValidationError, match="need at least one value"):
        LabelSelectorRequirement(key="a", operator="Exists", values=["x"])
    assert LabelSelectorRequirement(key="a", operator="Exists").values == []


def test_fleet_defaults_are_the_design_defaults() -> None:
    fleet = RolloutFleetSpec.model_validate({"shardSelector": {"matchLabels": {"fleet": "a"}}})
    policy = fleet.policy
    assert (policy.max_infra_attempts, policy.max_data_attempts, policy.max_skipped_prompts) == (5, 2, 0)
    assert (policy.backoff_initial_seconds, policy.backoff_max_seconds) == (1.0, 30.0)
    assert (policy.stall_deadline_seconds, policy.stall_check_seconds) == (600.0, 30.0)
    assert fleet.min_ready_shards == 1
    assert fleet.environment_server_selector is None


@pytest.mark.parametrize(
    ("kind", "rule"),
    [
        ("GenerationShard", "has(self.serviceRef) != has(self.endpoint)"),
        ("EnvironmentServer", "has(self.serviceRef) != has(self.endpoint)"),
        ("GenerationShard", "self.timeoutSeconds < self.periodSeconds"),
        ("EnvironmentServer", "self.timeoutSeconds < self.periodSeconds"),
        ("RolloutFleet", "self.stallDeadlineSeconds > self.attemptTimeoutSeconds"),
        ("RolloutFleet", "self.backoffMaxSeconds >= self.backoffInitialSeconds"),
    ],
)
def test_each_cross_field_rule_pydantic_enforces_is_also_a_cel_rule_in_the_crd(kind: str, rule: str) -> None:
    assert rule in _rules(kind)


def test_an_endpoint_with_credentials_is_refused() -> None:
    """The API server refuses it by CEL (see the e2e bad-input set); the model agrees, for objects read back."""
    import pydantic

    from fleet_operator.models import GenerationShardSpec

    with pytest.raises(pydantic.ValidationError, match="must not carry credentials"):
        GenerationShardSpec.model_validate({"endpoint": "http://user:hunter2@10.0.0.7:8000"})
