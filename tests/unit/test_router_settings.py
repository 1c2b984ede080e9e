"""The router's settings are named once, in RouterConfig: the CLI's options are generated from it, and the chart's
values, values schema and Deployment arguments are checked against it here. A router that follows a RolloutFleet
dispatches with that fleet's spec.policy under its own settings."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from typing import Any

import click
import pytest
import yaml
from pydantic.alias_generators import to_camel

from rollout_runtime.cli.router import router, serving_config, setting_flag
from rollout_runtime.dispatch import DispatchPolicy
from rollout_runtime.router.config import REQUEST_POLICY, ROUTER_SETTINGS, RouterConfig
from rollout_runtime.shards import StaticShardSource
from rollout_runtime.shards.kubernetes import KubernetesShardSource
from support.tools import REPO_ROOT

CHART = REPO_ROOT / "charts" / "rollout-fleet"
FIELDS = {name: RouterConfig.model_fields[name] for name in ROUTER_SETTINGS}


def _description(name: str) -> str:
    return " ".join((FIELDS[name].description or "").split())


def _chart_rows() -> dict[str, Any]:
    """values.yaml's documented keys as scripts/chart_readme.py reads them (what the chart README lists)."""
    spec = importlib.util.spec_from_file_location("chart_readme", REPO_ROOT / "scripts" / "chart_readme.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return {row.key: row for row in module.rows((CHART / "values.yaml").read_text())}


def test_every_setting_is_a_router_option_with_the_models_default_and_help() -> None:
    options = {p.name: p for p in router.params if isinstance(p, click.Option)}
    for name, field in FIELDS.items():
        option = options[name]
        assert option.opts == [setting_flag(name)]
        assert option.default == field.default, name
        assert option.help == _description(name)


def test_every_setting_is_a_documented_chart_value_with_the_models_default() -> None:
    rows = _chart_rows()
    for name, field in FIELDS.items():
        row = rows[f"router.{to_camel(name)}"]
        assert json.loads(row.default) == field.default, name
        assert row.description == _description(name), f"values.yaml's comment on router.{to_camel(name)}"


def test_the_values_schema_bounds_every_setting_as_the_model_does() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["router"]["properties"]
    model = RouterConfig.model_json_schema()["properties"]
    for name in ROUTER_SETTINGS:
        expected = {k: v for k, v in model[name].items() if k not in ("title", "default")}
        expected["description"] = _description(name)
        assert schema[to_camel(name)] == expected, f"values.schema.json router.{to_camel(name)}"


def test_the_deployment_passes_every_setting_and_nothing_the_router_does_not_take() -> None:
    template = (CHART / "templates" / "router-deployment.yaml").read_text()
    args = dict(re.findall(r"^\s*- (--[a-z-]+)=(.*)$", template, re.MULTILINE))
    for name, field in FIELDS.items():
        value = f".Values.router.{to_camel(name)}"
        assert args.pop(setting_flag(name)) == "{{ " + ("int " if field.annotation is int else "") + value + " }}"
    options = {opt for p in router.params for opt in p.opts}
    assert set(args) <= options, "every other argument is an option of the router command"


def test_a_router_that_follows_a_fleet_dispatches_with_its_policy_under_the_routers_settings() -> None:
    fleet = {"attemptTimeoutSeconds": 60, "hedgeFactor": 3, "maxWeightsLag": 2, "maxInfraAttempts": 9}
    config = RouterConfig(max_attempts=4).following(DispatchPolicy.from_fleet(fleet))
    policy = config.dispatch_policy()
    assert (policy.attempt_timeout_seconds, policy.hedge_factor, policy.max_weights_lag) == (60, 3, 2)
    assert policy.max_infra_attempts == 4, "the router's own setting"
    assert {name: getattr(policy, name) for name in REQUEST_POLICY} == REQUEST_POLICY
    assert RouterConfig().dispatch_policy() == DispatchPolicy(
        max_infra_attempts=3, healthy_wait_seconds=2.0, max_ejection_percent=100.0, **REQUEST_POLICY
    ), "a router over --shard URLs: DispatchPolicy's defaults under the router's"


async def test_the_router_command_takes_the_followed_fleets_policy_and_says_when_it_cannot() -> None:
    config = RouterConfig(max_concurrency=7)
    source = KubernetesShardSource("a", "ns")
    source.fleet_object = {"spec": {"policy": {"progressWatchdog": True, "ejectionBaseSeconds": 5}}}
    followed = await serving_config(source, config)
    assert (followed.policy.progress_watchdog, followed.policy.ejection_base_seconds) == (True, 5)
    assert followed.max_concurrency == 7
    assert await serving_config(StaticShardSource([]), config) is config
    source.fleet_object = {"spec": {"policy": {"maxRetries": 3}}}
    with pytest.raises(click.ClickException, match="does not know: maxRetries"):
        await serving_config(source, config)


def test_values_yaml_sets_every_setting_to_the_models_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["router"]
    assert RouterConfig(**{name: values[to_camel(name)] for name in ROUTER_SETTINGS}) == RouterConfig()
