"""The operator's settings at start: a bad FLEET_OPERATOR_* value is one line naming it and the fix, then exit 1."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fleet_operator.cli import operator
from fleet_operator.settings import InvalidSettings, OperatorSettings, load_settings


@pytest.mark.parametrize(
    ("env", "named", "hint"),
    [
        (
            {"FLEET_OPERATOR_LEASE_RENEW_SECONDS": "15"},
            ["FLEET_OPERATOR_LEASE_RENEW_SECONDS=15", "FLEET_OPERATOR_LEASE_DURATION_SECONDS=15"],
            "lower the renew interval",
        ),
        (
            {"FLEET_OPERATOR_PROBE_ALLOWED_HOSTS": '["http://bad host"]'},
            ["FLEET_OPERATOR_PROBE_ALLOWED_HOSTS"],
            "not URLs",
        ),
        (
            {"FLEET_OPERATOR_PROBE_ALLOWED_HOSTS": "10.0.0.0/33"},
            ["FLEET_OPERATOR_PROBE_ALLOWED_HOSTS='10.0.0.0/33'"],
            "CIDR blocks",
        ),
        ({"FLEET_OPERATOR_NAMESPACES": '["a",'}, ["FLEET_OPERATOR_NAMESPACES"], 'write ["a","b"] or a,b'),
        ({"FLEET_OPERATOR_HTTP_PORT": "70000"}, ["FLEET_OPERATOR_HTTP_PORT='70000'"], "less than or equal to 65535"),
        ({"FLEET_OPERATOR_LOG_LEVEL": "LOUD"}, ["FLEET_OPERATOR_LOG_LEVEL='LOUD'"], "'DEBUG', 'INFO'"),
    ],
)
def test_invalid_setting_is_one_line_naming_the_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: list[str], hint: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidSettings) as invalid:
        load_settings()
    message = str(invalid.value)
    assert "\n" not in message
    assert message.startswith("invalid operator settings: ")
    for text in [*named, hint]:
        assert text in message


def test_every_invalid_variable_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_OPERATOR_HTTP_PORT", "-1")
    monkeypatch.setenv("FLEET_OPERATOR_PROBE_CONCURRENCY", "0")
    with pytest.raises(InvalidSettings) as invalid:
        load_settings()
    assert "FLEET_OPERATOR_HTTP_PORT='-1'" in str(invalid.value)
    assert "FLEET_OPERATOR_PROBE_CONCURRENCY='0'" in str(invalid.value)


def test_valid_environment_loads_the_same_settings_as_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_OPERATOR_PROBE_ALLOWED_HOSTS", "*.gpu.internal, 10.0.0.0/8")
    monkeypatch.setenv("FLEET_OPERATOR_IDENTITY", "pod-0")
    assert load_settings() == OperatorSettings()
    assert load_settings().probe_allowed_hosts == ["*.gpu.internal", "10.0.0.0/8"]


def test_operator_command_with_invalid_settings_exits_1_with_one_line_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEET_OPERATOR_LEASE_RENEW_SECONDS", "30")
    result = CliRunner().invoke(operator, [])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "Error: invalid operator settings: lease_renew_seconds must be less than lease_duration_seconds "
        "(FLEET_OPERATOR_LEASE_RENEW_SECONDS=30, FLEET_OPERATOR_LEASE_DURATION_SECONDS=15): lower the renew "
        "interval (a third of the lease duration is usual) or raise the lease duration"
    ]
    assert "Traceback" not in result.output
