"""Every ``rollout-fleet`` subcommand given bad input: one line on stderr saying what to fix, exit 2 for usage and 1
for runtime errors, a traceback only with ``--debug``. Run through the group (as the console script does) with
click's CliRunner; tests/integration/test_cli_processes.py runs the real entry point for each class of error."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException, kube_config
from pydantic import BaseModel, Field, ValidationError

from rollout_runtime.cli import cli
from rollout_runtime.cli.errors import describe_error, describe_validation_error


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def assert_one_line_error(result: Result, exit_code: int, *fragments: str) -> None:
    assert result.exit_code == exit_code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), "no traceback"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No in-cluster service account and a ``$KUBECONFIG`` naming a file that does not exist."""
    missing = tmp_path / "missing-kubeconfig"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(missing))
    return missing


def kubeconfig_for(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "rl"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers: a hung API server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


USAGE_ERRORS: list[tuple[list[str], list[str]]] = [
    (["demo", "--prompts", "-5"], ["--prompts=-5", "greater than or equal to 1", "rollout-fleet demo --help"]),
    (["demo", "--over-long", "-1"], ["--over-long=-1"]),
    (["demo", "--metrics-port", "70000"], ["--metrics-port", "0<=x<=65535"]),
    (["sim-shard", "--port", "70000"], ["--port", "0<=x<=65535"]),
    (["sim-shard", "--error-rate", "2"], ["--error-rate"]),
    (["sim-env", "--kind", "verifier", "--log-level", "LOUD"], ["--log-level", "'LOUD' is not one of"]),
    (["sim-env", "--kind", "chess"], ["--kind"]),
    (["sim-env", "--kind", "verifier", "--episode-timeout", "-1"], ["--episode-timeout=-1.0"]),
    (["sim-env", "--kind", "verifier", "--max-concurrent-episodes", "4"], ["admission_timeout_seconds"]),
    (["classify", "--status", "999"], ["--status", "100..599"]),
    (["classify", "--status", "teapot"], ["--status", "not a valid integer"]),
    (["crds", "--check"], ["--check needs --output-dir"]),
    (["status", "-o", "xml"], ["--output", "'xml' is not one of"]),
    (["status", "--timeout", "0"], ["--timeout"]),
    (["status", "a", "-A"], ["drop -A/--all-namespaces or the name"]),
    (["no-such-command"], ["No such command"]),
    (["--no-such-flag"], ["No such option"]),
]


@pytest.mark.parametrize(("args", "fragments"), USAGE_ERRORS, ids=[" ".join(args) for args, _ in USAGE_ERRORS])
def test_a_usage_error_is_one_line_and_exit_2(args: list[str], fragments: list[str]) -> None:
    assert_one_line_error(run(*args), 2, *fragments)


def test_a_classify_error_prints_nothing_before_it() -> None:
    result = run("classify", "--status", "999")
    assert result.stdout == "", "the table is not printed for a command that then fails"


def test_the_operator_names_the_bad_setting_and_exits_1() -> None:
    result = run("operator", env={"FLEET_OPERATOR_LEASE_RENEW_SECONDS": "soon"})
    assert_one_line_error(result, 1, "FLEET_OPERATOR_LEASE_RENEW_SECONDS='soon'", "valid number")


def test_status_without_a_kubeconfig_says_where_it_looked(no_kubeconfig: Path) -> None:
    result = run("status")
    assert_one_line_error(
        result, 1, "no Kubernetes credentials", f"no kubeconfig file at {no_kubeconfig}", "KUBECONFIG"
    )


def test_status_with_a_missing_kubeconfig_file_names_it(tmp_path: Path) -> None:
    assert_one_line_error(run("status", "--kubeconfig", str(tmp_path / "nope")), 1, f"at {tmp_path / 'nope'}")


def test_status_against_a_server_that_never_answers_gives_up_at_the_timeout(tmp_path: Path, silent_server: int) -> None:
    kubeconfig = kubeconfig_for(tmp_path / "kubeconfig", f"https://127.0.0.1:{silent_server}")
    result = run("status", "--kubeconfig", str(kubeconfig), "--timeout", "0.5")
    assert_one_line_error(
        result, 1, f"cannot reach the API server at https://127.0.0.1:{silent_server}", "no answer within 0.5 s"
    )


def test_debug_shows_the_traceback_instead(no_kubeconfig: Path) -> None:
    result = run("--debug", "status")
    assert result.exit_code == 1
    assert isinstance(result.exception, ConfigException), "re-raised as it was, for its traceback"


def test_an_unexpected_error_is_one_line_naming_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr("fleet_operator.crds.generate_crds", broken)
    assert_one_line_error(run("crds"), 1, "unexpected KeyError", "--debug")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConfigException("Invalid kube-config file.\nNo configuration found."), "Invalid kube-config file. No"),
        (
            ApiException(status=403, reason="Forbidden"),
            "the API server answered 403 Forbidden",
        ),
        (FileNotFoundError(2, "No such file or directory", "/x/y"), "No such file or directory: /x/y"),
        (ConnectionRefusedError(111, "Connection refused"), "[Errno 111] Connection refused"),
        (TimeoutError(), "timed out"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_known_runtime_errors_are_described_on_one_line(error: BaseException, expected: str) -> None:
    described = describe_error(error)
    assert described is not None
    assert expected in described
    assert "\n" not in described


def test_an_api_error_is_the_servers_own_message() -> None:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "message": 'rolloutfleets.rolloutfleet.dev is forbidden: User "x"'})
    assert describe_error(error) == 'the API server answered 403 rolloutfleets.rolloutfleet.dev is forbidden: User "x"'


def test_a_bug_is_not_a_known_error() -> None:
    assert describe_error(KeyError("reward")) is None


class _Config(BaseModel):
    over_long_prompts: int = Field(ge=0)
    name: str


def test_a_validation_error_names_the_flag_of_each_field_it_knows() -> None:
    with pytest.raises(ValidationError) as caught:
        _Config(over_long_prompts=-1, name=3)  # type: ignore[arg-type]
    described = describe_validation_error(caught.value, {"over_long_prompts": "--over-long"})
    assert described == (
        "--over-long=-1: Input should be greater than or equal to 0; name: Input should be a valid string"
    )
