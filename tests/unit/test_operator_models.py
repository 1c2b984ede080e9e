"""The pydantic models reject what the CRD's CEL rules reject, and default what the CRD defaults."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from fleet_operator.crds import KINDS, render_crd
from rollout_runtime.dispatch.policy import FLEET_POLICY, POLICY_RULES, DispatchPolicy
from rollout_runtime.health import HealthState, ProbeSettings
from rollout_runtime.health.hysteresis import PROBE_IN_CLUSTER, PROBE_RULES
from rollout_runtime.kube.api import (
    DispatchPolicySpec,
    EnvironmentServerSpec,
    GenerationShardSpec,
    ProbeSpec,
)
from rollout_runtime.schema import ClusterView, Comparison, Requirement, Rule


def test_probe_defaults_follow_the_design() -> None:
    probe = GenerationShardSpec(endpoint="http://10.0.0.7:8000").probe
    assert (probe.path, probe.period_seconds, probe.timeout_seconds) == ("/health", 5.0, 2.0)
    assert (probe.failure_threshold, probe.success_threshold) == (3, 2)


def _probe_schemas(node: Any) -> list[dict[str, Any]]:
    """Every probe object schema in a rendered CRD (the nodes with both periodSeconds and timeoutSeconds)."""
    if isinstance(node, list):
        return [found for item in node for found in _probe_schemas(item)]
    if not isinstance(node, dict):
        return []
    here = [node] if {"periodSeconds", "timeoutSeconds"} <= set(node.get("properties", {})) else []
    return here + [found for value in node.values() for found in _probe_schemas(value)]


def test_the_crds_leave_the_probe_timeout_unset_so_it_follows_the_period() -> None:
    """No default for timeoutSeconds anywhere a probe is (a 2 s default would make periodSeconds 1 alone invalid),
    the omitted probe's own default leaves it out too, and the CEL rule holds while it is unset."""
    probes = [probe for info in KINDS for probe in _probe_schemas(render_crd(info))]
    assert len(probes) == 4  # GenerationShard, EnvironmentServer, RolloutFleet's shardPods and environmentPods
    for probe in probes:
        assert "default" not in probe["properties"]["timeoutSeconds"]
        assert probe["properties"]["periodSeconds"]["default"] == 5.0
        assert "timeoutSeconds" not in probe["default"]
        (rule,) = (r for r in probe["x-kubernetes-validations"] if r["fieldPath"] == ".timeoutSeconds")
        assert rule["rule"] == "!has(self.timeoutSeconds) || (self.timeoutSeconds < self.periodSeconds)"


@pytest.mark.parametrize(
    ("stored", "timeout"),
    [
        ({"periodSeconds": 1}, 0.5),
        ({"periodSeconds": 0.05}, 0.025),
        ({"periodSeconds": 10}, 2.0),
        ({"periodSeconds": 5}, 2.0),
        ({"periodSeconds": 1, "timeoutSeconds": 0.9}, 0.9),
        ({}, 2.0),
    ],
)
def test_the_operator_reads_an_unset_probe_timeout_as_the_runtime_derives_it(
    stored: dict[str, Any], timeout: float
) -> None:
    """What the API server stores after defaulting (every probe field but timeoutSeconds) read as the operator
    reads a spec: the timeout is ProbeSettings' own derivation from the period."""
    probe = {**PROBE_IN_CLUSTER.object_default(ProbeSpec().to_kube()), **stored}
    for spec_model in (GenerationShardSpec, EnvironmentServerSpec):
        read = spec_model.model_validate({"endpoint": "http://10.0.0.7:8000", "probe": probe}).probe
        assert read.timeout_seconds == pytest.approx(timeout)
    runtime = ProbeSettings.model_validate({k: v for k, v in probe.items() if k != "checkModel"})
    assert runtime.timeout_seconds == pytest.approx(timeout)


def test_a_cluster_view_cannot_both_derive_and_default_a_field() -> None:
    with pytest.raises(ValueError, match="derived fields"):
        ClusterView(scope="probe", defaults={"timeout_seconds": 1.0}, derived=frozenset({"timeout_seconds"}))


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
        ({"maxInfraAttempts": 0}, "greater than or equal to 1"),
        ({"stallAction": "explode"}, "warn"),
        ({"attemptTimeoutSeconds": 86_401}, "less than or equal to 86400"),
    ],
)
def test_bad_policy_fields_are_rejected_by_pydantic(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DispatchPolicySpec.model_validate(policy)


def test_the_crd_policy_is_the_runtime_policy_as_its_fleet_view_says() -> None:
    """Derived, not copied: every DispatchPolicy field but the excluded ones, the fleet's defaults, the same bounds."""
    assert set(DispatchPolicySpec.model_fields) == set(DispatchPolicy.model_fields) - FLEET_POLICY.excluded
    defaults = DispatchPolicySpec().model_dump(by_alias=False)
    assert defaults == {**DispatchPolicy().model_dump(exclude=set(FLEET_POLICY.excluded)), **FLEET_POLICY.defaults}
    probe = ProbeSpec.model_json_schema()["properties"]
    assert (probe["periodSeconds"]["minimum"], probe["timeoutSeconds"]["minimum"]) == (0.05, 0.01)
    assert probe["failureThreshold"] == ProbeSettings.model_json_schema()["properties"]["failureThreshold"]


def _cel_rules_at(kind: str, field: str) -> list[dict[str, str]]:
    spec = render_crd(next(k for k in KINDS if k.kind == kind))["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules: list[dict[str, str]] = spec["properties"]["spec"]["properties"][field]["x-kubernetes-validations"]
    return rules


def _breaking(rule: Comparison, right: float) -> tuple[float, float]:
    """Values of (left, right) that break ``rule``, and then ones on its boundary that keep it."""
    broken = {">": right, ">=": right / 2, "<": right, "<=": right * 2}[rule.op]
    kept = {">": right * 2, ">=": right, "<": right / 2, "<=": right}[rule.op]
    return broken, kept


def _specs(rule: Rule, derived: type[BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A spec that breaks ``rule`` and one on its boundary that keeps it."""
    if isinstance(rule, Requirement):
        broken_left = {">": rule.bound, ">=": rule.bound - 1, "<": rule.bound, "<=": rule.bound + 1}[rule.op]
        return {rule.when: rule.equals, rule.left: broken_left}, {rule.when: rule.equals, rule.left: rule.bound}
    right = float(derived.model_fields[rule.right].get_default())
    broken, kept = _breaking(rule, right)
    return {rule.left: broken, rule.right: right}, {rule.left: kept, rule.right: right}


_RULES: list[tuple[tuple[str, ...], ClusterView, type[BaseModel], type[BaseModel], Rule]] = [
    *((("RolloutFleet",), FLEET_POLICY, DispatchPolicySpec, DispatchPolicy, rule) for rule in POLICY_RULES),
    *((("GenerationShard", "EnvironmentServer"), PROBE_IN_CLUSTER, ProbeSpec, ProbeSettings, r) for r in PROBE_RULES),
]


@pytest.mark.parametrize(
    ("kinds", "view", "derived", "runtime", "rule"),
    _RULES,
    ids=[f"{case[-1].left}{case[-1].op}{case[-1].right}" for case in _RULES],
)
def test_each_rule_is_one_cel_rule_and_one_validator_that_reject_the_same_specs(
    kinds: tuple[str, ...], view: ClusterView, derived: type[BaseModel], runtime: type[BaseModel], rule: Rule
) -> None:
    """One rules list: the CRD carries the rule as CEL, and both pydantic models reject exactly what it rejects,
    the CRD model with the CEL message (e2e checks the API server's answer against the same text)."""
    for kind in kinds:
        assert rule.cel(scope=view.scope, optional=view.derived) in _cel_rules_at(kind, view.scope)
    broken, kept = _specs(rule, derived)
    messages = {
        derived: rule.message(name=to_camel),
        runtime: rule.message(values={rule.left: broken[rule.left], rule.right: broken[rule.right]}),
    }
    for model, message in messages.items():
        with pytest.raises(ValidationError) as caught:
            model.model_validate(broken)
        assert message in str(caught.value)
        model.model_validate(kept)


def test_an_endpoint_with_credentials_is_refused() -> None:
    """The API server refuses it by CEL (see the e2e bad-input set); the model agrees, for objects read back."""
    import pydantic

    from rollout_runtime.kube.api import GenerationShardSpec

    with pytest.raises(pydantic.ValidationError, match="must not carry credentials"):
        GenerationShardSpec.model_validate({"endpoint": "http://user:hunter2@10.0.0.7:8000"})
