"""scripts/chart_readme.py writes the chart README's values table from values.yaml's ``# --`` comments."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import yaml

from support.tools import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "chart_readme.py"
CHART_DIR = REPO_ROOT / "charts" / "rollout-fleet"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_readme", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def test_committed_chart_readme_is_the_generator_output() -> None:
    readme = (CHART_DIR / "README.md").read_text()
    values = (CHART_DIR / "values.yaml").read_text()
    assert _module().updated_readme(readme, values) == readme, "run `.venv/bin/python scripts/chart_readme.py`"


def test_check_mode_exits_0_when_current() -> None:
    result = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_every_documented_key_gets_a_row_with_its_type_default_and_continued_description() -> None:
    values = """\
# File header: not a key's description.

# -- Replicas.
replicaCount: 1
image:
  # -- Image tag; empty means the chart's appVersion,
  # continued on a second line.
  tag: ""
# -- Pod security context.
podSecurityContext:
  runAsNonRoot: true
# -- Extra labels, e.g. {a: b|c}.
podLabels: {}
"""
    rows = _module().rows(values)
    assert [(row.key, row.type, row.default, row.description) for row in rows] == [
        ("replicaCount", "int", "1", "Replicas."),
        ("image.tag", "string", '""', "Image tag; empty means the chart's appVersion, continued on a second line."),
        ("podSecurityContext", "object", '{"runAsNonRoot": true}', "Pod security context."),
        ("podLabels", "object", "{}", "Extra labels, e.g. {a: b|c}."),
    ]
    table = _module().render(rows)
    assert "e.g. {a: b\\|c}." in table  # a pipe would end the cell


def test_the_table_lists_every_leaf_the_chart_documents() -> None:
    """Every top-level value of values.yaml appears, itself or through its documented keys."""
    readme = (CHART_DIR / "README.md").read_text()
    for key in yaml.safe_load((CHART_DIR / "values.yaml").read_text()):
        assert f"| `{key}" in readme, key
