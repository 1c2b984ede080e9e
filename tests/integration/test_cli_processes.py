"""The installed ``rollout-fleet`` console script given bad input, one process per class of error: what a user
sees is one line on stderr (no traceback) and the exit code, 2 for usage and 1 for runtime errors. The same cases
for every subcommand, in-process, are in tests/unit/test_cli_errors.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROLLOUT_FLEET_CLI = Path(sys.executable).parent / "rollout-fleet"


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """A new user's environment: an empty home, a ``$KUBECONFIG`` that names nothing, not in a pod."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "FLEET_OPERATOR_", "ROLLOUT_FLEET"))}
    return {**env, "HOME": str(home), "KUBECONFIG": str(home / ".kube" / "config"), "COLUMNS": "200"}


def rollout_fleet(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROLLOUT_FLEET_CLI), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def the_error(done: subprocess.CompletedProcess[str], exit_code: int) -> str:
    """The single ``Error:`` line on stderr, after checking the exit code."""
    assert done.returncode == exit_code, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


def kubeconfig_for(path: Path, port: int) -> Path:
    cluster = {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True}
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose connections complete in the kernel's backlog and are never answered."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield int(listener.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["demo", "--prompts", "-5"], "--prompts=-5: Input should be greater than or equal to 1"),
        (["demo", "--metrics-port", "70000"], "'--metrics-port': 70000 is not in the range 0<=x<=65535"),
        (["sim-env", "--kind", "verifier", "--log-level", "LOUD"], "'--log-level': 'LOUD' is not one of"),
    ],
    ids=["demo --prompts -5", "demo --metrics-port 70000", "sim-env --log-level LOUD"],
)
def test_a_usage_error_is_one_line_and_exit_2(args: list[str], fragment: str, user_env: dict[str, str]) -> None:
    assert fragment in the_error(rollout_fleet(*args, env=user_env), 2)


def test_status_without_a_kubeconfig_says_so_on_one_line(user_env: dict[str, str]) -> None:
    error = the_error(rollout_fleet("status", env=user_env), 1)
    assert f"no kubeconfig file at {user_env['KUBECONFIG']}" in error


def test_status_against_a_closed_port_cannot_reach_the_api_server(
    user_env: dict[str, str], tmp_path: Path, closed_port: int
) -> None:
    kubeconfig = kubeconfig_for(tmp_path / "kubeconfig", closed_port)
    error = the_error(rollout_fleet("status", "--kubeconfig", str(kubeconfig), env=user_env), 1)
    assert f"cannot reach the API server at https://127.0.0.1:{closed_port}: " in error
    assert "Connect call failed" in error


def test_status_against_a_silent_server_gives_up_at_its_timeout(
    user_env: dict[str, str], tmp_path: Path, silent_port: int
) -> None:
    kubeconfig = kubeconfig_for(tmp_path / "kubeconfig", silent_port)
    done = rollout_fleet("status", "-A", "--timeout", "1", "--kubeconfig", str(kubeconfig), env=user_env)
    assert the_error(done, 1).endswith(
        f"cannot reach the API server at https://127.0.0.1:{silent_port}: no answer within 1 s (--timeout)"
    )


def test_the_operator_with_a_bad_setting_names_it(user_env: dict[str, str]) -> None:
    done = rollout_fleet("operator", env={**user_env, "FLEET_OPERATOR_PROBE_ALLOWED_HOSTS": '["10.0.0.0/99"]'})
    assert "FLEET_OPERATOR_PROBE_ALLOWED_HOSTS" in the_error(done, 1)


def test_debug_shows_the_traceback(user_env: dict[str, str]) -> None:
    done = rollout_fleet("--debug", "status", env=user_env)
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "ConfigException" in done.stderr
