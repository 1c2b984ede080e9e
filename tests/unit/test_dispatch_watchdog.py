"""The stall watchdog: pure verdicts over a fake clock, and the watch loop under looptime."""

from __future__ import annotations

import asyncio

import pytest

from rollout_runtime.dispatch import StallVerdict, StallWatchdog, watch


def test_no_verdict_before_the_deadline() -> None:
    dog = StallWatchdog(60, "warn", now=0)
    assert dog.check(59.9, unfinished=3) is None


def test_a_verdict_once_the_deadline_passes_without_a_commit() -> None:
    dog = StallWatchdog(60, "abort", now=0)
    assert dog.check(60, unfinished=3) == StallVerdict(action="abort", idle_seconds=60, unfinished=3)


def test_a_commit_restarts_the_deadline() -> None:
    dog = StallWatchdog(60, "warn", now=0)
    dog.committed(50)
    assert dog.check(100, unfinished=1) is None
    assert dog.check(110, unfinished=1) is not None


def test_one_verdict_per_stall_episode() -> None:
    dog = StallWatchdog(60, "warn", now=0)
    assert dog.check(60, unfinished=1) is not None
    assert dog.check(90, unfinished=1) is None
    assert dog.check(600, unfinished=1) is None
    dog.committed(601)
    assert dog.check(661, unfinished=1) is not None


def test_nothing_unfinished_is_idle_not_stalled() -> None:
    dog = StallWatchdog(60, "warn", now=0)
    assert dog.check(1000, unfinished=0) is None
    assert dog.check(1059, unfinished=2) is None, "the clock restarts when work arrives"


def test_the_message_says_how_long_and_how_many() -> None:
    verdict = StallVerdict(action="warn", idle_seconds=612.5, unfinished=7)
    assert verdict.message() == ("rollout stalled: 7 prompt(s) unfinished and none committed for 612.5s (action: warn)")


def test_deadline_must_be_positive() -> None:
    with pytest.raises(ValueError, match="deadline_seconds must be > 0"):
        StallWatchdog(0, "warn", now=0)


@pytest.mark.looptime
async def test_watch_checks_on_the_loop_clock_and_reports_at_the_first_check_past_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    dog = StallWatchdog(600, "warn", now=loop.time())
    reported: list[tuple[float, StallVerdict]] = []
    done = asyncio.Event()

    def on_stall(verdict: StallVerdict) -> None:
        reported.append((loop.time(), verdict))
        done.set()

    start = loop.time()
    task = asyncio.create_task(watch(dog, check_seconds=30, clock=loop.time, unfinished=lambda: 5, on_stall=on_stall))
    await done.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [(at, verdict)] = reported
    assert at - start == 600
    assert verdict.unfinished == 5
