"""A credential planted in every position foreign text reaches an output from never reaches that output.

Positions (issue 15): a target's HTTP reason phrase, a served model id, an endpoint's path or query, a failure's
message (the ledger entry), and the operator's log record of a transition. Outputs: the probe result's message,
the target's status (``lastError``, ``endpoint``, conditions), the transition Event, the ledger line, the log line.
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fleet_operator.decisions import shard_status, transition_event
from rollout_runtime.dispatch.ledger import LedgerEntry
from rollout_runtime.failures import GenerationUnavailable, RolloutDataFailure, diagnose
from rollout_runtime.generation import GenerationClient
from rollout_runtime.health import HealthPhase, HealthState, ProbeReason, ProbeSettings, ProbeTargetPolicy, Transition
from rollout_runtime.health.probe import HttpProber, check_model_list
from rollout_runtime.redaction import redact_secrets

SECRETS = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=20, max_size=48
).filter(
    # a key mixes letters and digits (not a word the output holds anyway, like "consecutiveSuccesses")
    lambda s: any(c.isdigit() for c in s) and any(c.isalpha() for c in s)
)
SHAPES = st.sampled_from(
    [
        "Invalid API key: {s}",
        "api key {s}",
        "password {s}",
        "Ocp-Apim-Subscription-Key: {s}",
        "Bearer {s}",
        "sk-{s}",
        "http://shard.example:8000/v1/{s}/completions",
        "http://shard.example:8000/v1/completions?api_key={s}",
    ]
)
PROSE = st.text(alphabet=st.characters(codec="ascii", categories=("L", "N", "Zs", "P")), max_size=40)
SETTINGS = ProbeSettings(period_seconds=1.0, timeout_seconds=0.9, failure_threshold=1, success_threshold=1)


def _planted(shape: str, secret: str, before: str, after: str) -> str:
    assume(secret not in before and secret not in after)  # the surrounding text is not itself the secret
    return f"{before} {shape.format(s=secret)} {after}"


def _operator_outputs(result_message: str, endpoint: str) -> list[str]:
    """The status, Event and log line the operator writes for a target whose probe failed with ``result_message``."""
    state = HealthState(SETTINGS)
    state.observe(HttpProber._failure(ProbeReason.STATUS, result_message, 0.0, 500))
    status = shard_status(state, endpoint=endpoint, generation=1, last_success_at=None, previous=None, now=0.0)
    note = transition_event(
        Transition(
            from_phase=HealthPhase.HEALTHY,
            to_phase=HealthPhase.UNHEALTHY,
            reason="status",
            message=state.last_error or "",
        )
    )
    record = logging.LogRecord("fleet_operator.engine", logging.INFO, __file__, 1, "%s: %s", ("x", note.message), None)
    return [status.model_dump_json(by_alias=True), note.message, record.getMessage()]


@settings(max_examples=300, deadline=None)
@given(secret=SECRETS, shape=SHAPES, before=PROSE, after=PROSE)
def test_a_secret_in_a_reason_phrase_reaches_no_status_event_or_log(
    secret: str, shape: str, before: str, after: str
) -> None:
    message = f"GET http://s.team.svc:8000/health answered 500 {_planted(shape, secret, before, after)}"
    assert not [out for out in _operator_outputs(message, "http://s.team.svc:8000") if secret in out]


@settings(max_examples=300, deadline=None)
@given(secret=SECRETS, shape=SHAPES, before=PROSE, after=PROSE)
def test_a_secret_in_a_served_model_id_reaches_no_status_event_or_log(
    secret: str, shape: str, before: str, after: str
) -> None:
    body = json.dumps({"data": [{"id": _planted(shape, secret, before, after)}]}).encode()
    problem = check_model_list(body, "expected-model")
    assert problem is not None
    assert not [out for out in _operator_outputs(problem[1], "http://s.team.svc:8000") if secret in out]


@settings(max_examples=300, deadline=None)
@given(secret=SECRETS, in_query=st.booleans(), name=st.sampled_from(["key", "api_key", "token", "sig"]))
def test_a_secret_in_an_endpoint_is_refused_and_never_published(secret: str, in_query: bool, name: str) -> None:
    endpoint = f"http://10.0.0.7:8000/v1?{name}={secret}" if in_query else f"http://10.0.0.7:8000/{secret}/v1"
    policy = ProbeTargetPolicy(allowed_hosts=("10.0.0.0/8",))
    assert not policy.check_endpoint(endpoint, "team").allowed  # the operator marks the spec invalid
    assert not policy.check(endpoint + "/health").allowed  # and a prober refuses it
    assert not [out for out in _operator_outputs("connection refused", endpoint) if secret in out]


@settings(max_examples=300, deadline=None)
@given(secret=SECRETS, shape=SHAPES, before=PROSE, after=PROSE, infra=st.booleans())
def test_a_secret_in_a_failure_message_reaches_no_ledger_entry(
    secret: str, shape: str, before: str, after: str, infra: bool
) -> None:
    text = _planted(shape, secret, before, after)
    failure = GenerationUnavailable(text) if infra else RolloutDataFailure(text)
    diagnosis = diagnose(failure)
    entry = LedgerEntry(
        prompt_id=1,
        result="data_failed",
        failure_class=diagnosis.failure_class.value,
        failure_type=diagnosis.failure_type,
        reason=diagnosis.reason,
        attempts=1,
        shards=("s0",),
        time=0.0,
    )
    assert secret not in entry.to_json()


@settings(max_examples=300, deadline=None)
@given(secret=SECRETS, shape=SHAPES, before=PROSE, after=PROSE, status=st.sampled_from([400, 401, 403, 404, 503]))
def test_a_secret_in_a_shards_error_body_reaches_no_failure(
    secret: str, shape: str, before: str, after: str, status: int
) -> None:
    body = json.dumps({"error": {"message": _planted(shape, secret, before, after)}}).encode()
    try:
        GenerationClient._raise_for_status(status, body, "shard s0 (http://s.team.svc:8000)")
    except (GenerationUnavailable, RolloutDataFailure) as exc:
        assert secret not in str(exc)
        assert secret not in diagnose(exc).reason
    else:
        raise AssertionError("an error status must raise")


@pytest.mark.parametrize(
    "text",
    [
        "TOKEN password 0000000000000000000A",
        "token password hunter22",
        "Bearer secret s3cr3tvalue99",
        "TOKEN Ocp-Apim-Subscription-Key: 0000000000000000000A",
    ],
)
def test_a_credential_word_after_an_auth_scheme_does_not_shield_the_secret_after_it(text: str) -> None:
    """Found by hypothesis: "token" read as an auth scheme took "password" for its credential, hid the word and left
    the password itself in the ledger."""
    secret = text.rsplit(" ", 1)[1]
    assert secret not in redact_secrets(text)
