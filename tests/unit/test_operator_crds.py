"""The committed CRDs are the generator's output, and that output is a structural, valid Kubernetes CRD."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from pydantic import BaseModel

from fleet_operator.cli import crds as crds_command
from fleet_operator.crds import KINDS, crd_files, generate_crds, render_crd, structural

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.35"


def test_committed_crds_equal_the_generator_output() -> None:
    assert crd_files(REPO / "crds") == generate_crds(), "run `rollout-fleet crds -o crds` and commit the result"


def test_cli_check_reports_stale_files(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(crds_command, ["-o", str(tmp_path)]).exit_code == 0
    assert runner.invoke(crds_command, ["-o", str(tmp_path), "--check"]).exit_code == 0
    stale = tmp_path / "rolloutfleet.dev_rolloutfleets.yaml"
    stale.write_text(stale.read_text().replace("rfleet", "rf"))
    result = runner.invoke(crds_command, ["-o", str(tmp_path), "--check"])
    assert result.exit_code == 1
    assert "rolloutfleet.dev_rolloutfleets.yaml" in result.output


def test_cli_prints_all_four_crds_as_one_stream() -> None:
    result = CliRunner().invoke(crds_command, [])
    documents = [d for d in yaml.safe_load_all(result.output) if d]
    assert sorted(d["spec"]["names"]["kind"] for d in documents) == [
        "EnvironmentServer",
        "GenerationShard",
        "PolicyVersion",
        "RolloutFleet",
    ]


@pytest.mark.parametrize("text", generate_crds().values(), ids=list(generate_crds()))
def test_generated_crd_validates_against_the_kubernetes_openapi(text: str) -> None:
    kubernetes_validate.validate(yaml.safe_load(text), KUBERNETES_VERSION, strict=True)


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("info", KINDS, ids=[k.kind for k in KINDS])
def test_every_schema_node_is_structural(info: Any) -> None:
    """Structural: every node has a type; no $ref, anyOf, titles or nulls survive the conversion."""
    schema = render_crd(info)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _nodes(schema):
        assert "type" in node, f"{info.kind}{path} has no type"
        assert not {"$ref", "anyOf", "allOf", "oneOf", "title", "$defs"} & set(node), f"{info.kind}{path}: {node}"
        assert node.get("default", 0) is not None


def test_structural_turns_optionals_and_exclusive_bounds_into_openapi_v3() -> None:
    class Inner(BaseModel):
        x: int

    class Outer(BaseModel):
        inner: Inner | None = None
        ratio: float = 0.5

    schema = structural(
        {
            **Outer.model_json_schema(),
            "properties": {
                **Outer.model_json_schema()["properties"],
                "ratio": {"type": "number", "exclusiveMinimum": 0, "default": 0.5},
            },
        }
    )
    assert schema["properties"]["inner"] == {
        "type": "object",
        "properties": {"x": {"type": "integer"}},
        "required": ["x"],
    }
    assert schema["properties"]["ratio"] == {"type": "number", "minimum": 0, "exclusiveMinimum": True, "default": 0.5}


def _columns(kind: str) -> dict[str, str]:
    info = next(k for k in KINDS if k.kind == kind)
    return {c["name"]: c["jsonPath"] for c in render_crd(info)["spec"]["versions"][0]["additionalPrinterColumns"]}


def test_shard_printer_columns_show_phase_model_latency_and_age() -> None:
    columns = _columns("GenerationShard")
    assert columns["Phase"] == ".status.phase"
    assert columns["Model"] == ".spec.model"
    assert columns["Latency-ms"] == ".status.latencyMilliseconds"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_fleet_printer_columns_show_healthy_over_total_and_ready() -> None:
    columns = _columns("RolloutFleet")
    assert columns["Healthy"] == ".status.healthy"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'


@pytest.mark.parametrize("info", KINDS, ids=[k.kind for k in KINDS])
def test_every_kind_has_status_subresource_short_name_and_category(info: Any) -> None:
    """Every kind with a status has the status subresource (the operator's only write); the trainer-written
    PolicyVersion has neither, so nothing can write a status to it."""
    spec = render_crd(info)["spec"]
    if info.status is None:
        assert "subresources" not in spec["versions"][0]
        assert "status" not in spec["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    else:
        assert spec["versions"][0]["subresources"] == {"status": {}}
    assert spec["names"]["shortNames"]
    assert spec["names"]["categories"] == ["rollout-fleet"]
    assert spec["group"] == "rolloutfleet.dev"
    assert spec["versions"][0]["name"] == "v1alpha1"
