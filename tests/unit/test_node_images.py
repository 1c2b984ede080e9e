"""tools/images.py reads what the operator image is from operator/Dockerfile, the one source of truth.

The node of the cluster tier cannot pull the Dockerfile's base, so the image is built from Debian's packages; what
these tests hold is that the builder takes every runtime setting from the Dockerfile (and nothing from elsewhere),
so a change there changes the built image: umoci writes the image's config from this spec, and the cluster tier runs
the result as the chart's and the examples' pods.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import images

REPO_ROOT = Path(__file__).resolve().parents[2]
VALUES = yaml.safe_load((REPO_ROOT / "charts" / "rollout-fleet" / "values.yaml").read_text())


@pytest.fixture(scope="module")
def spec() -> images.ImageSpec:
    return images.dockerfile_spec(images.DOCKERFILE.read_text())


def test_the_base_tag_gives_the_debian_suite_and_python_minor_version(spec: images.ImageSpec) -> None:
    assert (spec.suite, spec.python) == ("bookworm", "3.11")


def test_the_venv_and_lock_are_the_ones_the_dockerfile_installs(spec: images.ImageSpec) -> None:
    assert spec.venv == "/opt/rollout-fleet"
    assert spec.lock == "operator/requirements.lock"
    assert (REPO_ROOT / spec.lock).exists()


def test_the_runtime_settings_are_the_runtime_stages(spec: images.ImageSpec) -> None:
    user, _, group = spec.user.partition(":")
    assert (int(user), int(group)) == (
        VALUES["podSecurityContext"]["runAsUser"],
        VALUES["podSecurityContext"]["runAsGroup"],
    )
    assert (spec.entrypoint, spec.cmd) == (["rollout-fleet"], ["operator"])
    assert spec.exposed == [f"{VALUES['operator']['httpPort']}/tcp"]
    assert spec.env["PATH"].startswith(f"{spec.venv}/bin:")
    assert spec.env["PATH"].endswith(":/usr/bin:/sbin:/bin"), "$PATH expands to the base image's PATH"
    assert spec.env["HOME"] == spec.workdir == "/tmp"
    assert spec.labels["org.opencontainers.image.title"] == "rollout-fleet-operator"


def test_a_change_in_the_dockerfile_changes_the_spec() -> None:
    """The builder hard-codes none of it: edit the Dockerfile, and the spec follows."""
    text = images.DOCKERFILE.read_text()
    edited = text.replace("USER 65532:65532", "USER 1000:1000").replace('CMD ["operator"]', 'CMD ["sim-shard"]')
    edited = edited.replace("python:3.11.14-slim-bookworm", "python:3.12.1-slim-trixie")
    changed = images.dockerfile_spec(edited)
    assert (changed.user, changed.cmd, changed.suite, changed.python) == ("1000:1000", ["sim-shard"], "trixie", "3.12")


def test_the_spec_command_prints_json(capsys: pytest.CaptureFixture[str], spec: images.ImageSpec) -> None:
    assert images.main(["spec"]) == 0
    assert json.loads(capsys.readouterr().out)["venv"] == spec.venv
