"""The chart ships the generated CRDs: its crds/ is a byte-for-byte copy of the top-level crds/.

Helm installs a chart's crds/ on first install only (docs/operations.md, "Upgrade", says how to upgrade them), so
a chart whose copy drifted from the generator's output would install an old schema that prunes new status fields.
Refresh the copy with: cp crds/*.yaml charts/rollout-fleet/crds/
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = REPO_ROOT / "crds"
CHART_COPY = REPO_ROOT / "charts" / "rollout-fleet" / "crds"


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.yaml"))}


def test_chart_crds_are_identical_to_the_generated_top_level_crds() -> None:
    generated = _files(TOP_LEVEL)
    assert generated, "crds/ is empty: run `rollout-fleet crds -o crds`"
    shipped = _files(CHART_COPY)
    assert sorted(shipped) == sorted(generated), "refresh: cp crds/*.yaml charts/rollout-fleet/crds/"
    for name, content in generated.items():
        assert shipped[name] == content, f"charts/rollout-fleet/crds/{name} differs from crds/{name}"


def test_chart_ships_the_four_kinds_as_valid_crds() -> None:
    kinds = set()
    for path in CHART_COPY.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, "1.35.0", strict=True)
            assert doc["spec"]["group"] == "rolloutfleet.dev"
            kinds.add(doc["spec"]["names"]["kind"])
    assert kinds == {"GenerationShard", "EnvironmentServer", "RolloutFleet", "PolicyVersion"}
