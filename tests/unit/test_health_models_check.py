"""The /v1/models check is total: any bytes from the network get a verdict, never an exception."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.health import ProbeReason, check_model_list

MODEL = "qwen-0.5b"


def test_listed_model_passes() -> None:
    body = json.dumps({"object": "list", "data": [{"id": "other"}, {"id": MODEL}]}).encode()
    assert check_model_list(body, MODEL) is None


def test_empty_list_is_a_wrong_model_saying_so() -> None:
    verdict = check_model_list(b'{"data": []}', MODEL)
    assert verdict is not None
    assert verdict[0] is ProbeReason.WRONG_MODEL
    assert "no models" in verdict[1]


def test_long_model_lists_are_summarised() -> None:
    body = json.dumps({"data": [{"id": f"m{i}"} for i in range(50)]}).encode()
    verdict = check_model_list(body, MODEL)
    assert verdict is not None
    assert "and 45 more" in verdict[1]


def test_deeply_nested_json_is_malformed_not_a_crash() -> None:
    verdict = check_model_list(b"[" * 60_000, MODEL)
    assert verdict is not None
    assert verdict[0] is ProbeReason.MALFORMED


@given(st.binary(max_size=512))
def test_any_bytes_get_a_verdict(body: bytes) -> None:
    """Invariant: arbitrary bytes never raise and are never taken as serving the model unless they list it."""
    verdict = check_model_list(body, MODEL)
    if verdict is None:
        assert MODEL in json.loads(body)["data"][0]["id"] or any(e.get("id") == MODEL for e in json.loads(body)["data"])
    else:
        assert verdict[0] in (ProbeReason.MALFORMED, ProbeReason.WRONG_MODEL)


@given(
    st.lists(
        st.one_of(st.fixed_dictionaries({"id": st.text(max_size=30)}), st.integers(), st.none(), st.text()),
        max_size=8,
    )
)
def test_verdict_is_ok_exactly_when_well_formed_and_listed(entries: list[object]) -> None:
    """Invariant: ok iff every entry is an object with a string id and one of them is the expected model."""
    verdict = check_model_list(json.dumps({"data": entries}).encode(), MODEL)
    well_formed = all(isinstance(e, dict) and isinstance(e.get("id"), str) for e in entries)
    listed = well_formed and any(isinstance(e, dict) and e.get("id") == MODEL for e in entries)
    assert (verdict is None) == listed
    if verdict is not None:
        assert verdict[0] is (ProbeReason.WRONG_MODEL if well_formed else ProbeReason.MALFORMED)
