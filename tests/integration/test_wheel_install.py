"""The install path the README gives: ``scripts/build-wheel`` builds one wheel, and that wheel alone (in a fresh
virtualenv, away from the checkout) gives a working ``rollout-fleet`` CLI, runtime library and operator."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from support.tools import REPO_ROOT, cache_root, versions

VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def pinned_uv() -> Path:
    """The uv scripts/uv.sh installs (build-wheel installs it first): fast, and installs from the shared cache."""
    return cache_root() / f"uv-{versions()['UV_VERSION']}" / "bin" / "uv"


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command outside the checkout, with no trace of the test's own virtualenv in the environment."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env.setdefault("UV_CACHE_DIR", str(cache_root() / "uv-cache"))  # the cache scripts/uv.sh uses
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = _run(REPO_ROOT / "scripts" / "build-wheel", out, cwd=out)
    assert built.returncode == 0, built.stderr
    path = Path(built.stdout.strip().splitlines()[-1])
    assert path.parent == out
    assert path.name == f"rollout_fleet-{VERSION}-py3-none-any.whl"
    return path


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with only the wheel (and its dependencies) installed; its bin directory."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    home = tmp_path_factory.mktemp("home")
    uv = pinned_uv()
    created = _run(uv, "venv", "--quiet", "--python", sys.executable, venv, cwd=home)
    assert created.returncode == 0, created.stderr
    pip = _run(uv, "pip", "install", "--quiet", "--python", venv / "bin" / "python", wheel, cwd=home)
    assert pip.returncode == 0, pip.stderr
    return venv / "bin"


def test_the_wheel_holds_the_runtime_and_the_operator_and_nothing_build_time(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("rollout_fleet-")}
    assert packages == {"rollout_runtime", "fleet_operator"}
    assert "rollout_runtime/py.typed" in names
    entry_points = zipfile.ZipFile(wheel).read(f"rollout_fleet-{VERSION}.dist-info/entry_points.txt").decode()
    assert "rollout-fleet = rollout_runtime.cli:main" in entry_points


def test_the_installed_cli_reports_its_version(installed: Path, tmp_path: Path) -> None:
    done = _run(installed / "rollout-fleet", "--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert VERSION in done.stdout


def test_the_installed_package_imports_from_the_venv_not_the_checkout(installed: Path, tmp_path: Path) -> None:
    code = "import rollout_runtime, fleet_operator; print(rollout_runtime.__file__); print(fleet_operator.__file__)"
    done = _run(installed / "python", "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.split():
        assert Path(line).is_relative_to(installed.parent), line


@pytest.mark.parametrize("command", ["sim-shard", "sim-env", "operator", "demo"])
def test_the_subcommands_the_examples_and_the_image_run_are_in_the_wheel(
    installed: Path, tmp_path: Path, command: str
) -> None:
    done = _run(installed / "rollout-fleet", command, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout
