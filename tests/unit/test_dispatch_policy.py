"""DispatchPolicy: the documented defaults and clear validation errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rollout_runtime.dispatch import DispatchPolicy


def test_defaults_are_the_documented_ones() -> None:
    policy = DispatchPolicy()
    assert (policy.max_infra_attempts, policy.max_data_attempts, policy.max_skipped_prompts) == (5, 2, 0)
    assert (policy.backoff_initial_seconds, policy.backoff_multiplier, policy.backoff_max_seconds) == (1, 2, 30)
    assert (policy.stall_deadline_seconds, policy.stall_check_seconds, policy.stall_action) == (600, 30, "warn")
    assert policy.attempt_timeout_seconds is None
    assert policy.failure_ledger_path is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"attempt_timeout_seconds": 600},
            "stall_deadline_seconds (600.0) must be greater than attempt_timeout_seconds (600.0)",
        ),
        (
            {"attempt_timeout_seconds": 120, "stall_deadline_seconds": 60, "stall_check_seconds": 10},
            "stall_deadline_seconds (60.0) must be greater than attempt_timeout_seconds (120.0)",
        ),
        (
            {"backoff_initial_seconds": 10, "backoff_max_seconds": 5},
            "backoff_max_seconds (5.0) must be at least backoff_initial_seconds (10.0)",
        ),
        (
            {"ejection_base_seconds": 60, "ejection_max_seconds": 30},
            "ejection_max_seconds (30.0) must be at least ejection_base_seconds (60.0)",
        ),
        ({"stall_check_seconds": 700}, "stall_check_seconds (700.0) must not exceed stall_deadline_seconds (600.0)"),
        ({"max_infra_attempts": 0}, "max_infra_attempts\n  Input should be greater than or equal to 1"),
        ({"attempt_timeout_seconds": 0}, "attempt_timeout_seconds\n  Input should be greater than 0"),
        ({"stall_action": "panic"}, "stall_action\n  Input should be 'warn' or 'abort'"),
        ({"backoff_jitter": 1.5}, "backoff_jitter\n  Input should be less than or equal to 1"),
        ({"max_ejection_percent": 101}, "max_ejection_percent\n  Input should be less than or equal to 100"),
        ({"healthy_wait_seconds": float("inf")}, "healthy_wait_seconds\n  Input should be a finite number"),
        ({"max_retries": 3}, "max_retries\n  Extra inputs are not permitted"),
        ({"stall_check_seconds": 1e-300}, "stall_check_seconds\n  Input should be greater than or equal to 0.01"),
        ({"backoff_initial_seconds": 1e9}, "backoff_initial_seconds\n  Input should be less than or equal to 3600"),
        ({"backoff_max_seconds": 1e9}, "backoff_max_seconds\n  Input should be less than or equal to 3600"),
    ],
)
def test_invalid_policies_are_rejected_with_a_clear_message(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        DispatchPolicy(**fields)
    assert message in str(caught.value)


def test_a_stall_deadline_longer_than_the_attempt_timeout_is_accepted() -> None:
    policy = DispatchPolicy(attempt_timeout_seconds=300, stall_deadline_seconds=301)
    assert policy.attempt_timeout_seconds == 300


def test_policy_is_immutable() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        DispatchPolicy().max_infra_attempts = 9  # type: ignore[misc]


def test_from_fleet_reads_camel_case_with_the_fleet_defaults_and_overrides_winning(tmp_path: Path) -> None:
    policy = DispatchPolicy.from_fleet(
        {"maxInfraAttempts": 3, "stallAction": "abort"}, max_concurrency=8, failure_ledger_path=tmp_path / "l"
    )
    assert (policy.max_infra_attempts, policy.stall_action, policy.max_concurrency) == (3, "abort", 8)
    assert policy.attempt_timeout_seconds == 300, "a fleet bounds an attempt by default"
    assert policy.failure_ledger_path == tmp_path / "l"


@pytest.mark.parametrize(
    ("spec_policy", "error", "message"),
    [
        ({"maxRetries": 3, "maxInfraAttempts": 2}, ValueError, "does not know: maxRetries"),
        ({"max_infra_attempts": 2}, ValueError, "does not know: max_infra_attempts"),
        ({"failureLedgerPath": "/etc/passwd"}, ValueError, "does not know: failureLedgerPath"),
        ({"maxInfraAttempts": 0}, ValidationError, "greater than or equal to 1"),
        ({"stallDeadlineSeconds": 300}, ValidationError, "stall_deadline_seconds (300.0) must be greater than"),
    ],
)
def test_from_fleet_refuses_unknown_fields_and_bad_values(
    spec_policy: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        DispatchPolicy.from_fleet(spec_policy)
    assert message in str(caught.value)


def _crd_policy_schema() -> dict[str, Any]:
    import yaml

    crd = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "crds" / "rolloutfleet.dev_rolloutfleets.yaml").read_text()
    )
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return dict(spec["properties"]["policy"]["properties"])


@pytest.mark.parametrize(
    ("field", "camel"),
    [
        ("stall_check_seconds", "stallCheckSeconds"),
        ("backoff_max_seconds", "backoffMaxSeconds"),
        ("backoff_initial_seconds", "backoffInitialSeconds"),
    ],
)
def test_the_runtime_and_the_crd_share_one_set_of_bounds(field: str, camel: str) -> None:
    """What the CRD refuses (below its minimum, above its maximum) the runtime policy refuses too: one source."""
    schema = _crd_policy_schema()[camel]
    low, high = schema["minimum"], schema["maximum"]
    for bad in (high * 10, (low / 2) if low > 0 else -1.0):
        with pytest.raises(ValidationError):
            DispatchPolicy(**{field: bad, "stall_deadline_seconds": 604_800})
