"""A shard the trainer registers: its probe goes through ProbeSettings before it is written, so the same rules and
the same derived timeout apply as everywhere else."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from rollout_runtime.shards.registration import OwnerRef, probe_spec, registered_shard

OWNER = OwnerRef(kind="Pod", name="trainer-0", uid="0b1c")


@pytest.mark.parametrize(
    ("given", "written"),
    [
        ({"periodSeconds": 1}, {"periodSeconds": 1.0}),  # no timeout written: the operator derives 0.5 s
        ({"period_seconds": 0.5, "timeout_seconds": 0.3}, {"periodSeconds": 0.5, "timeoutSeconds": 0.3}),
        ({"path": "/ready", "checkModel": False}, {"path": "/ready", "checkModel": False}),
    ],
)
def test_only_the_given_probe_fields_are_written_in_camel_case(given: dict[str, Any], written: dict[str, Any]) -> None:
    assert probe_spec(given) == written
    shard = registered_shard("s0", "http://10.0.0.7:8000", owner=OWNER, fleet="a", probe=given)
    assert shard["spec"]["probe"] == written


@pytest.mark.parametrize(
    ("given", "complaint"),
    [
        ({"periodSeconds": 1, "timeoutSeconds": 2}, "timeout_seconds (2.0) must be less than period_seconds (1.0)"),
        ({"periodSecond": 1}, "Extra inputs are not permitted"),  # the API server would prune it silently
        ({"path": "health"}, "absolute URL path"),
    ],
)
def test_a_bad_probe_fails_before_anything_is_written(given: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(complaint)):
        registered_shard("s0", "http://10.0.0.7:8000", owner=OWNER, fleet="a", probe=given)


def test_without_a_probe_the_crd_defaults_it() -> None:
    assert "probe" not in registered_shard("s0", "http://10.0.0.7:8000", owner=OWNER, fleet="a")["spec"]
