"""EpisodeCleanupContext: LIFO, bounded, idempotent, isolated, shielded."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rollout_runtime.environment import EpisodeCleanupContext


async def test_callbacks_run_in_lifo_order() -> None:
    order: list[str] = []
    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=1.0)
    for name in ("sandbox", "browser", "session"):
        ctx.register(lambda name=name: order.append(name), name=name)

    failures = await ctx.aclose()

    assert order == ["session", "browser", "sandbox"]
    assert failures == []


async def test_sync_and_async_callbacks_both_run() -> None:
    ran: list[str] = []

    async def release_remote() -> None:
        await asyncio.sleep(0)
        ran.append("remote")

    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=1.0)
    ctx.register(lambda: ran.append("local"))
    ctx.register(release_remote)
    await ctx.aclose()

    assert ran == ["remote", "local"]


@pytest.mark.looptime
async def test_a_hung_callback_is_cut_at_its_own_timeout_and_later_ones_still_run() -> None:
    ran: list[str] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=5.0)
    ctx.register(lambda: ran.append("first-registered"), name="first")
    ctx.register(lambda: asyncio.sleep(3600), name="hung")

    failures = await ctx.aclose()

    assert ran == ["first-registered"]
    assert [(f.name, f.timed_out) for f in failures] == [("hung", True)]
    assert loop.time() - start == pytest.approx(5.0)


async def test_a_failing_callback_does_not_stop_the_others() -> None:
    ran: list[str] = []

    def explode() -> None:
        raise RuntimeError("sandbox API said 500")

    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=1.0)
    ctx.register(lambda: ran.append("a"), name="a")
    ctx.register(explode, name="exploding")
    ctx.register(lambda: ran.append("c"), name="c")

    failures = await ctx.aclose()

    assert ran == ["c", "a"]
    assert len(failures) == 1
    assert failures[0].name == "exploding"
    assert failures[0].error_type == "RuntimeError"
    assert "sandbox API said 500" in failures[0].message
    assert not failures[0].timed_out


async def test_each_callback_runs_at_most_once_however_often_cleanup_is_asked() -> None:
    calls: list[str] = []
    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=1.0)
    handle = ctx.register(lambda: calls.append("closed"), name="sandbox")
    ctx.register(lambda: calls.append("other"), name="other")

    await ctx.close(handle)  # a protocol boundary closes it early
    await ctx.close(handle)
    await ctx.aclose()
    await ctx.aclose()

    assert calls == ["closed", "other"]
    assert ctx.pending == 0


async def test_closing_one_participant_runs_just_its_callback() -> None:
    calls: list[str] = []
    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=1.0)
    ctx.register(lambda: calls.append("a"), name="a")
    middle = ctx.register(lambda: calls.append("b"), name="b")
    ctx.register(lambda: calls.append("c"), name="c")

    failure = await ctx.close(middle)

    assert failure is None
    assert calls == ["b"]
    assert ctx.pending == 2


async def test_closing_a_foreign_callback_is_refused() -> None:
    ours = EpisodeCleanupContext(cleanup_timeout_seconds=1.0)
    theirs = EpisodeCleanupContext(cleanup_timeout_seconds=1.0)
    handle = theirs.register(lambda: None, name="theirs")

    with pytest.raises(ValueError, match="not registered"):
        await ours.close(handle)


async def test_unwinding_is_shielded_from_the_callers_cancellation() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    finished: list[str] = []

    async def slow_release() -> None:
        started.set()
        await release.wait()
        finished.append("slow")

    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=60.0)
    ctx.register(lambda: finished.append("earlier"), name="earlier")
    ctx.register(slow_release, name="slow")
    task = asyncio.create_task(ctx.aclose())
    await started.wait()

    task.cancel()
    await asyncio.sleep(0)  # deliver the cancellation while the callback is still running
    assert not task.done()
    release.set()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == ["slow", "earlier"]


@pytest.mark.looptime
async def test_total_cleanup_is_bounded_by_count_times_timeout() -> None:
    loop = asyncio.get_running_loop()
    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=2.0)
    for i in range(4):
        ctx.register(lambda: asyncio.sleep(3600), name=f"hung-{i}")
    assert ctx.bound_seconds == 8.0
    start = loop.time()

    failures = await ctx.aclose()

    assert len(failures) == 4
    assert loop.time() - start <= ctx.cleanup_timeout_seconds * 4


async def test_registering_after_unwinding_started_is_an_error() -> None:
    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=1.0)
    await ctx.aclose()
    with pytest.raises(RuntimeError, match="already unwinding"):
        ctx.register(lambda: None)


def test_cleanup_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        EpisodeCleanupContext(cleanup_timeout_seconds=0)


async def test_a_callback_that_swallows_cancellation_is_abandoned_at_its_timeout() -> None:
    gate = asyncio.Event()
    ran: list[str] = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await gate.wait()  # ignores the cancellation and keeps the release "running"

    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=0.05)
    ctx.register(lambda: ran.append("earlier"), name="earlier")
    ctx.register(stubborn, name="stubborn")
    failures = await ctx.aclose()  # returns although the stubborn callback is still running
    assert [(f.name, f.timed_out) for f in failures] == [("stubborn", True)]
    assert ran == ["earlier"]
    gate.set()


async def test_a_blocking_synchronous_callback_runs_in_a_thread_and_never_blocks_the_loop() -> None:
    entered = threading.Event()
    gate = threading.Event()

    def blocking_release() -> None:
        entered.set()
        gate.wait()

    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=3600)
    ctx.register(blocking_release, name="blocking")
    unwinding = asyncio.create_task(ctx.aclose())
    await asyncio.to_thread(entered.wait)  # the callback blocks its thread, and this loop still runs
    assert not unwinding.done()
    gate.set()
    assert await unwinding == []


async def test_a_blocking_synchronous_callback_is_bounded_by_its_timeout() -> None:
    gate = threading.Event()
    ctx = EpisodeCleanupContext(cleanup_timeout_seconds=0.05)
    ctx.register(gate.wait, name="blocking")
    failures = await ctx.aclose()
    assert [(f.name, f.timed_out) for f in failures] == [("blocking", True)]
    gate.set()
