"""Dependency failures: the retryable-status table, error classification, reasons, handled failures."""

from __future__ import annotations

import aiohttp
import pytest
from pydantic import BaseModel, ValidationError

from rollout_runtime.environment import (
    MAX_FAILURE_REASON_CHARS,
    FailureReport,
    dependency_episode_failure,
    format_exception_with_response_body,
    handled_episode_failure,
    is_handled_episode_failure,
    is_retryable_dependency_error,
    is_retryable_dependency_status,
    unhandled_episode_failure,
)
from rollout_runtime.environment.failures import _RETRYABLE_CLIENT_ERROR_STATUSES
from rollout_runtime.failures import http_status_is_infra


def _response_error(status: int, message: str = "") -> aiohttp.ClientResponseError:
    return aiohttp.ClientResponseError(request_info=None, history=(), status=status, message=message)  # type: ignore[arg-type]


def test_every_status_is_retryable_exactly_when_the_runtime_calls_it_infra() -> None:
    """Every status in 100..599 at once: the environment side and the generation side agree on each."""
    disagree = [s for s in range(100, 600) if is_retryable_dependency_status(s) is not http_status_is_infra(s)]
    assert disagree == []


def test_the_retryable_client_error_table_is_408_425_429_and_says_what_is_retried() -> None:
    """Seed 004's contract, over its table: 408, 425, 429 and every 5xx are retried; every other 4xx is terminal."""
    assert sorted(_RETRYABLE_CLIENT_ERROR_STATUSES) == [408, 425, 429]
    wrong = [
        s
        for s in range(100, 600)
        if is_retryable_dependency_status(s) is not (s >= 500 or s in _RETRYABLE_CLIENT_ERROR_STATUSES)
    ]
    assert wrong == []


@pytest.mark.parametrize("status", [-1, 0, 99, 600, 1000])
def test_a_status_outside_the_http_range_gets_the_same_bool(status: int) -> None:
    assert is_retryable_dependency_status(status) is http_status_is_infra(status) is (status >= 500)


class _Reply(BaseModel):
    total: int


def _validation_error() -> ValidationError:
    try:
        _Reply.model_validate({"total": "many"})
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (ConnectionRefusedError(111, "Connection refused"), True),
        (ConnectionResetError(), True),
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientPayloadError("cut off"), True),
        (TimeoutError(), True),
        (aiohttp.ServerTimeoutError(), True),
        (_response_error(503), True),
        (_response_error(429), True),
        (_response_error(425), True),
        (_response_error(408), True),
        (_response_error(400), False),
        (_response_error(404), False),
        (_response_error(422), False),
        (_validation_error(), False),
        (ValueError("bad reply"), False),
        (KeyError("total"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_dependency_errors_are_retryable_only_when_transient(error: BaseException, retryable: bool) -> None:
    assert is_retryable_dependency_error(error) is retryable


def test_a_wrapped_connection_failure_is_still_transient() -> None:
    outer = RuntimeError("tool call failed")
    outer.__cause__ = ConnectionRefusedError()
    assert is_retryable_dependency_error(outer)


def test_the_reason_keeps_the_dependencys_own_explanation_from_its_body() -> None:
    error = _response_error(400, "Bad Request")
    failure = dependency_episode_failure(error, stage="tool", response_body='{"detail": "unknown tool: rm"}')

    assert "unknown tool: rm" in failure.event.reason
    assert "Bad Request" in failure.event.reason
    assert failure.terminal  # 400: the dependency refuses the request itself
    assert failure.dependency


def test_the_body_attribute_of_a_dependency_error_is_used_by_default() -> None:
    error = _response_error(503, "Service Unavailable")
    error.body = "sandbox pool exhausted"  # type: ignore[attr-defined]
    assert format_exception_with_response_body(error).endswith(": sandbox pool exhausted")


def test_the_reason_is_bounded_to_2000_characters() -> None:
    failure = dependency_episode_failure(_response_error(500), stage="judge", response_body="x" * 50_000)
    assert len(failure.event.reason) == MAX_FAILURE_REASON_CHARS == 2000
    assert failure.event.reason.endswith("...")
    assert not failure.terminal


def test_the_class_name_prefixes_the_reason_only_when_asked() -> None:
    error = ConnectionRefusedError("refused")
    named = dependency_episode_failure(error, stage="tool", name_error_type=True)
    plain = dependency_episode_failure(error, stage="tool")

    assert named.event.reason == "ConnectionRefusedError: refused"
    assert plain.event.reason == "refused"
    assert named.event.error_type == plain.event.error_type == "ConnectionRefusedError"


def test_an_error_without_a_message_is_described_by_its_class() -> None:
    failure = dependency_episode_failure(TimeoutError(), stage="tool")
    assert failure.event.reason == "TimeoutError"
    assert not failure.terminal


def test_terminal_defaults_to_not_retryable_and_the_stage_may_override_it() -> None:
    assert dependency_episode_failure(ConnectionResetError(), stage="s").terminal is False
    assert dependency_episode_failure(ValueError("x"), stage="s").terminal is True
    assert dependency_episode_failure(ConnectionResetError(), stage="s", terminal=True).terminal is True


def test_partial_evidence_is_kept_for_the_response_adapter_not_in_the_event() -> None:
    failure = dependency_episode_failure(
        TimeoutError(), stage="generate", partial_response="The answer is", tokens=3, handle=object()
    )
    report = failure.report()

    assert report.evidence["partial_response"] == "The answer is"
    assert report.evidence["tokens"] == 3
    assert str(report.evidence["handle"]).startswith("<object object")  # not JSON: described, not dropped
    assert "partial_response" not in failure.event.model_dump()
    assert "terminal" not in failure.event.model_dump()
    FailureReport.model_validate_json(report.model_dump_json())  # crosses the wire intact


def test_handled_failures_are_recognised_and_others_are_not() -> None:
    handled = handled_episode_failure("verify", "answer is not a number", terminal=True)
    assert is_handled_episode_failure(handled)
    assert handled.event.kind == "episode_failed"  # unset kind records the registered default
    assert not is_handled_episode_failure(ValueError("x"))
    assert not is_handled_episode_failure(RuntimeError("handled?"))


def test_an_unhandled_exception_becomes_a_terminal_failure_with_a_bounded_message() -> None:
    failure = unhandled_episode_failure(KeyError("reward" * 1000))
    assert failure.terminal
    assert failure.event.kind == "unhandled_exception"
    assert failure.event.reason.startswith("KeyError: ")
    assert len(failure.event.reason) <= 2000
    assert "Traceback" not in failure.event.reason
