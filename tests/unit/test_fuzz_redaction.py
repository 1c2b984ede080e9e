"""Redaction of credentials in failure messages: planted secrets never survive, honest messages are untouched."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_runtime.redaction import REDACTED, redact_secrets
from rollout_runtime.sim import vllm_context_length_message
from support.chaos import write_tally

TALLY: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def fuzz_report() -> Iterator[None]:
    yield
    write_tally("fuzz-redaction", TALLY)


secrets_ = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=16, max_size=40)
separators = st.sampled_from([" ", "\n", "\t", "(", "[", "{", ", ", "; ", '"', "'", "| "])
prose = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
CONTEXTS = [
    "Authorization: Bearer {s}",
    "authorization: bearer {s}",
    "Bearer {s}",
    "Basic {s}",
    "Token {s}",
    "api_key={s}",
    "apiKey: {s}",
    '"api_key": "{s}"',
    "'access_token': '{s}'",
    "password={s}",
    "client_secret={s}",
    "X-Api-Key: {s}",
    "http://user:{s}@10.0.0.7:8000/v1",
    "https://{s}@example.com",
    "redis://:{s}@cache:6379/0",
    "?token={s}&x=1",
    "sk-{s}",
    "hf_{s}",
    "ghp_{s}0000000000",
    # issue 15: credentials in prose, vendor headers, URL paths and queries
    "Invalid API key: {s}",
    "Invalid API key provided: {s}",
    "api key {s}",
    "password {s}",
    "password: {s}",
    "Ocp-Apim-Subscription-Key: {s}",
    "x-goog-api-key: {s}",
    "http://shard.example:8000/v1/completions?key={s}",
    "http://shard.example:8000/v1/completions?x=1&api_key={s}#top",
    "https://h.example/x?sig={s}",
]


@settings(max_examples=1500, deadline=None)
@given(secret=secrets_, context=st.sampled_from(CONTEXTS), before=prose, after=prose, sep1=separators, sep2=separators)
def test_a_planted_secret_never_survives_redaction(
    secret: str, context: str, before: str, after: str, sep1: str, sep2: str
) -> None:
    """Wherever a credential sits in a recognised context (auth scheme, key=value, URL userinfo, known token
    shape), surrounded by any text, the redacted message does not contain it."""
    TALLY["test_a_planted_secret_never_survives_redaction"] += 1
    text = before + sep1 + context.format(s=secret) + sep2 + after
    redacted = redact_secrets(text)
    assert secret not in redacted.replace(before, "").replace(after, "")
    assert REDACTED in redacted


path_secrets = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", min_size=20, max_size=64
).filter(lambda s: any(c.isdigit() for c in s) and any(c.isalpha() for c in s))  # a key mixes them
PATH_CONTEXTS = [
    "http://shard.example:8000/v1/{s}/completions",
    "https://shard.example/{s}",
    "http://10.0.0.7:8000/{s}/v1/models?x=1",
    "http://[fd00::7]:8000/key/{s}#frag",
]


@settings(max_examples=500, deadline=None)
@given(secret=path_secrets, context=st.sampled_from(PATH_CONTEXTS), before=prose, after=prose, sep=separators)
def test_a_key_in_a_url_path_never_survives_redaction(
    secret: str, context: str, before: str, after: str, sep: str
) -> None:
    """A path segment of 20+ letters and digits mixed is treated as a key (a model name has dots and dashes)."""
    TALLY["test_a_key_in_a_url_path_never_survives_redaction"] += 1
    text = before + sep + context.format(s=secret) + " " + after
    assert secret not in redact_secrets(text).replace(before, "").replace(after, "")


@settings(max_examples=1000, deadline=None)
@given(text=st.text(max_size=300) | st.builds(lambda c, s: c.format(s=s), st.sampled_from(CONTEXTS), secrets_))
def test_redaction_is_idempotent_and_never_grows_a_message_much(text: str) -> None:
    """Redacting twice changes nothing more; a redacted message is never longer than the original plus markers."""
    TALLY["test_redaction_is_idempotent_and_never_grows_a_message_much"] += 1
    once = redact_secrets(text)
    assert redact_secrets(once) == once
    assert len(once) <= len(text) + len(REDACTED)


@pytest.mark.parametrize(
    "message",
    [
        vllm_context_length_message(4096, 5000, 16),
        vllm_context_length_message(4096, 5000, None),
        "The model `sim-model` does not exist.",
        "shard shard-1 (http://127.0.0.1:8000) answered HTTP 503: injected fault: HTTP 503",
        "no routable shard within 30s",
        "environment episode failed at stage 'parse_problem' (episode_failed): not a '<int> <op> <int>' problem",
        "GET http://shard.team-a.svc.cluster.local:8000/health answered 500 Internal Server Error",
        "expected model 'llama-3' but the shard serves ['mistral-7b']",
        "max_tokens must be an integer >= 1, got 0",
        "prompt 17 failed 5 infra attempt(s) on shards ['a', 'b']; last: RolloutTimeout: attempt exceeded 300s",
    ],
)
def test_honest_messages_pass_unchanged(message: str) -> None:
    assert redact_secrets(message) == message
