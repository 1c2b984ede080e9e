"""Episode identity as pure decisions: one live attempt per id, stale attempts fenced off, finished ones remembered."""

from __future__ import annotations

import asyncio

import pytest

from rollout_runtime.environment import (
    CheckpointCoordinator,
    EpisodeSteps,
    MemoryCheckpointStore,
    ProtocolState,
)
from rollout_runtime.environment.attempts import EpisodeAttempts, EpisodeInProgress
from support.environment import until


def test_one_live_attempt_per_episode_id() -> None:
    attempts: EpisodeAttempts[str] = EpisodeAttempts(capacity=4)
    first = attempts.claim("e")
    assert first is not None
    assert attempts.claim("e") is None  # a second attempt of a live episode gets nothing
    assert attempts.claim("other") is not None  # other episodes are independent
    attempts.release(first)
    second = attempts.claim("e")
    assert second is not None
    assert second.generation > first.generation


def test_a_stale_release_never_evicts_the_live_attempt() -> None:
    """The fencing rule: only the live attempt owns the episode; releasing an old one changes nothing."""
    attempts: EpisodeAttempts[str] = EpisodeAttempts(capacity=4)
    old = attempts.claim("e")
    assert old is not None
    attempts.release(old)
    live = attempts.claim("e")
    assert live is not None
    attempts.release(old)  # the abandoned attempt ends (again) late
    assert attempts.live("e") is live
    assert live.live
    assert not old.live
    assert attempts.claim("e") is None


async def test_a_waiting_attempt_gets_the_episode_once_the_live_one_ends() -> None:
    attempts: EpisodeAttempts[str] = EpisodeAttempts(capacity=4)
    first = attempts.claim("e")
    assert first is not None
    waiter = asyncio.create_task(attempts.acquire("e", wait_seconds=3600))
    await until(lambda: attempts.waiting == 1)
    attempts.release(first)
    second = await waiter
    assert attempts.live("e") is second
    assert attempts.waiting == 0


async def test_an_attempt_is_refused_when_the_live_one_outlasts_the_wait() -> None:
    attempts: EpisodeAttempts[str] = EpisodeAttempts(capacity=4)
    first = attempts.claim("e")
    assert first is not None
    with pytest.raises(EpisodeInProgress, match="already has a live attempt"):
        await attempts.acquire("e", wait_seconds=0)
    assert attempts.live("e") is first


def test_finished_episodes_are_remembered_per_input_and_bounded() -> None:
    attempts: EpisodeAttempts[str] = EpisodeAttempts(capacity=2)
    attempts.remember("a", "digest-a", "result-a")
    attempts.remember("b", "digest-b", "result-b")
    assert attempts.finished("a", "digest-a") == "result-a"
    assert attempts.finished("a", "another input") is None  # the same id for another input is a new episode
    attempts.remember("c", "digest-c", "result-c")  # "b" is now the least recently used
    assert attempts.finished("b", "digest-b") is None
    assert attempts.finished("a", "digest-a") == "result-a"
    nothing: EpisodeAttempts[str] = EpisodeAttempts(capacity=0)
    nothing.remember("a", "digest-a", "result-a")
    assert nothing.finished("a", "digest-a") is None


async def test_an_abandoned_attempt_neither_exports_nor_drops_its_successors_checkpoint() -> None:
    store = MemoryCheckpointStore()
    coordinator = CheckpointCoordinator(store, protocol="p")
    attempts: EpisodeAttempts[str] = EpisodeAttempts(capacity=0)
    old = attempts.claim("e")
    assert old is not None
    stale = EpisodeSteps(coordinator, episode_id="e", input_digest="d", attempt=old)
    await stale.start()
    stale.latest = ProtocolState(next_step="stale")
    attempts.release(old)  # abandoned, yet its task runs on
    live = attempts.claim("e")
    assert live is not None
    current = EpisodeSteps(coordinator, episode_id="e", input_digest="d", attempt=live)
    await current.start()
    await current.step("apply-0", lambda: asyncio.sleep(0))
    await current.record(ProtocolState(next_step="apply-1"))

    manifest = await coordinator.open()
    coordinator.resume()
    assert manifest.episodes["e"].next_step == "apply-1"  # the live attempt's state, never the stale one's
    await stale.finish(keep_checkpoint=False)  # the abandoned attempt ends as if it had finished
    record = await store.load("e")
    assert record is not None
    assert record.state.next_step == "apply-1"
