"""The refit sequence both weights writers share (local WeightsTracker, cluster PolicyVersionWriter): its order,
its version rules and its failure handling, driven through a recording RefitSteps."""

from __future__ import annotations

import asyncio

import pytest

from rollout_runtime.weights.refit import (
    MAX_FAILURE_MESSAGE_CHARS,
    RefitError,
    check_refit_version,
    failure_message,
    failures_by_shard,
    next_policy_version,
    refit,
    refit_all,
)


class Steps:
    """Records every step; ``identity`` is what the post-update read returns (an exception: it raises)."""

    def __init__(
        self, policy_version: int | None = 3, identity: str | Exception | None = "pod:0", fail_record: bool = False
    ) -> None:
        self._policy_version = policy_version
        self.identity = identity
        self.fail_record = fail_record
        self.calls: list[tuple[object, ...]] = []

    @property
    def policy_version(self) -> int | None:
        return self._policy_version

    async def begin(self, shard: str, version: int) -> None:
        self.calls.append(("begin", shard, version))

    async def identity_after(self, shard: str) -> str | None:
        self.calls.append(("identity", shard))
        if isinstance(self.identity, Exception):
            raise self.identity
        return self.identity

    async def succeeded(self, shard: str, version: int, identity: str | None) -> None:
        self.calls.append(("succeeded", shard, version, identity))

    async def failed(self, shard: str, version: int, message: str) -> None:
        self.calls.append(("failed", shard, version, message))
        if self.fail_record:
            raise ConnectionError("API server unreachable")


async def test_a_clean_refit_drains_reads_the_identity_after_the_update_and_records_it() -> None:
    steps = Steps()
    async with refit(steps, "s0", 3):
        steps.calls.append(("update",))
    assert steps.calls == [("begin", "s0", 3), ("update",), ("identity", "s0"), ("succeeded", "s0", 3, "pod:0")]


async def test_a_failed_update_leaves_the_shard_stale_and_propagates() -> None:
    steps = Steps()
    with pytest.raises(OSError, match="disk full"):
        async with refit(steps, "s0", 2):
            raise OSError("disk full")
    assert steps.calls == [("begin", "s0", 2), ("failed", "s0", 2, "OSError: disk full")]


async def test_an_unreadable_identity_after_the_update_fails_the_refit() -> None:
    steps = Steps(identity=RefitError("could not read its identity"))
    with pytest.raises(RefitError):
        async with refit(steps, "s0", 3):
            pass
    assert steps.calls[-1] == ("failed", "s0", 3, "RefitError: could not read its identity")
    assert not any(call[0] == "succeeded" for call in steps.calls)


async def test_a_failure_to_record_the_failure_never_hides_the_updates_own_error() -> None:
    steps = Steps(fail_record=True)
    with pytest.raises(ValueError, match="bad checkpoint"):
        async with refit(steps, "s0", 3):
            raise ValueError("bad checkpoint")
    assert steps.calls[-1][0] == "failed"  # it was tried, and its ConnectionError was logged, not raised


async def test_a_cancelled_update_is_recorded_as_failed_and_stays_cancelled() -> None:
    steps = Steps()
    with pytest.raises(asyncio.CancelledError):
        async with refit(steps, "s0", 3):
            raise asyncio.CancelledError
    assert steps.calls[-1] == ("failed", "s0", 3, "CancelledError: ")


@pytest.mark.parametrize(("published", "version"), [(None, 0), (3, 4)])
async def test_a_refit_ahead_of_the_published_policy_is_refused_before_it_drains(
    published: int | None, version: int
) -> None:
    steps = Steps(policy_version=published)
    with pytest.raises(ValueError, match=r"call publish\(version\) first"):
        async with refit(steps, "s0", version):
            pytest.fail("the update ran")
    assert steps.calls == []


def test_policy_versions_are_steps_that_never_go_backwards() -> None:
    assert next_policy_version(None, 0) == 0
    assert next_policy_version(4, 4) == 4
    assert next_policy_version(4, 7) == 7
    with pytest.raises(ValueError, match="step >= 0"):
        next_policy_version(None, -1)
    with pytest.raises(ValueError, match="went backwards: 4 -> 3"):
        next_policy_version(4, 3)
    check_refit_version(4, 4)
    check_refit_version(4, 1)


def test_a_failure_message_is_bounded() -> None:
    message = failure_message(RuntimeError("x" * 10_000))
    assert message.startswith("RuntimeError: x")
    assert len(message) == MAX_FAILURE_MESSAGE_CHARS


def test_failures_are_collected_by_shard_but_a_cancellation_is_re_raised() -> None:
    boom = OSError("boom")
    assert failures_by_shard(["a", "b", "c"], [None, boom, None]) == {"b": boom}
    with pytest.raises(asyncio.CancelledError):
        failures_by_shard(["a", "b"], [boom, asyncio.CancelledError()])


async def test_refit_all_refits_every_shard_and_one_failure_stops_no_other() -> None:
    steps = Steps()
    updated: list[str] = []

    async def update(name: str) -> None:
        if name == "s1":
            raise OSError("s1 unreachable")
        updated.append(name)

    failures = await refit_all(lambda name, version: refit(steps, name, version), 3, update, ["s0", "s1", "s2"])
    assert set(failures) == {"s1"}
    assert str(failures["s1"]) == "s1 unreachable"
    assert sorted(updated) == ["s0", "s2"]
    recorded = {call[1]: call[0] for call in steps.calls if call[0] in ("succeeded", "failed")}
    assert recorded == {"s0": "succeeded", "s1": "failed", "s2": "succeeded"}
