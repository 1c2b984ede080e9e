"""Episode limits of BaseEnvironmentServer: admission queue and timeouts, episode timeouts, the derivation hook."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from rollout_runtime.environment import EnvironmentServerConfig
from support.environment import ProbeRequest, ProbeServer, until


def _count(server: ProbeServer, name: str, **labels: str) -> float:
    value = server.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_concurrency_limit_without_an_admission_timeout_is_refused() -> None:
    with pytest.raises(ValidationError, match="admission_timeout_seconds is required"):
        EnvironmentServerConfig(max_concurrent_episodes=4)


@pytest.mark.looptime
async def test_under_load_extra_episodes_queue_then_time_out_or_are_rejected_at_once() -> None:
    loop = asyncio.get_running_loop()
    server = ProbeServer(
        EnvironmentServerConfig(max_concurrent_episodes=2, max_queued_episodes=2, admission_timeout_seconds=5.0)
    )
    tasks = [asyncio.create_task(server.serve_episode(ProbeRequest(episode_id=f"e{i}", hold=True))) for i in range(6)]
    await until(lambda: server.running == 2 and server.limiter.queued == 2)
    assert _count(server, "environment_admission_queue_depth") == 2
    assert _count(server, "environment_episodes_in_flight") == 2

    rejected_now = [t for t in tasks if t.done()]
    assert len(rejected_now) == 2
    for task in rejected_now:
        result = task.result()
        assert result.http_status == 503
        assert result.outcome == "rejected"
        assert result.response.failure is not None
        assert result.response.failure.stage == "admission"
        assert result.response.failure.kind == "admission_rejected"
        assert result.response.failure.terminal is False

    queued = [t for t in tasks[2:] if not t.done()]
    start = loop.time()
    timed_out = await asyncio.gather(*queued)
    assert loop.time() - start == pytest.approx(5.0)
    for result in timed_out:
        assert result.http_status == 503
        assert result.response.failure is not None
        assert (result.response.failure.stage, result.response.failure.kind) == ("admission", "admission_timeout")
        assert result.response.failure.terminal is False

    server.release.set()
    finished = await asyncio.gather(*tasks[:2])
    assert [r.outcome for r in finished] == ["success", "success"]
    assert server.max_running == 2
    assert _count(server, "environment_episodes_total", outcome="rejected") == 4
    assert _count(server, "environment_episodes_total", outcome="success") == 2
    assert _count(server, "environment_admission_queue_depth") == 0
    assert _count(server, "environment_episodes_in_flight") == 0


async def test_a_queued_episode_takes_the_slot_a_finished_one_releases() -> None:
    server = ProbeServer(
        EnvironmentServerConfig(max_concurrent_episodes=1, max_queued_episodes=1, admission_timeout_seconds=60.0)
    )
    first = asyncio.create_task(server.serve_episode(ProbeRequest(episode_id="first", hold=True)))
    second = asyncio.create_task(server.serve_episode(ProbeRequest(episode_id="second", hold=True)))
    await until(lambda: server.running == 1 and server.limiter.queued == 1)

    server.release.set()

    assert (await first).outcome == "success"
    assert (await second).outcome == "success"
    assert server.max_running == 1


@pytest.mark.looptime
async def test_an_episode_over_its_timeout_fails_retryably_and_is_cleaned_up() -> None:
    loop = asyncio.get_running_loop()
    server = ProbeServer(EnvironmentServerConfig(default_episode_timeout_seconds=10.0))
    start = loop.time()

    result = await server.serve_episode(ProbeRequest(episode_id="slow", sleep_seconds=100.0))

    assert loop.time() - start == pytest.approx(10.0)
    assert result.outcome == "timeout"
    assert result.http_status == 200
    failure = result.response.failure
    assert failure is not None
    assert (failure.kind, failure.stage, failure.terminal) == ("episode_timeout", "episode", False)
    assert server.cleaned == ["slow"]
    assert _count(server, "environment_episodes_total", outcome="timeout") == 1


@pytest.mark.looptime
async def test_no_episode_timeout_means_no_bound() -> None:
    server = ProbeServer(EnvironmentServerConfig(default_episode_timeout_seconds=None))
    result = await server.serve_episode(ProbeRequest(sleep_seconds=86_400.0))
    assert result.outcome == "success"


class _LongerForBigTasks(ProbeServer):
    def episode_timeout_seconds(self, request: ProbeRequest) -> float | None:
        return 50.0 if request.sleep_seconds > 10 else super().episode_timeout_seconds(request)


@pytest.mark.looptime
async def test_a_protocol_may_derive_a_longer_timeout_per_episode() -> None:
    server = _LongerForBigTasks(EnvironmentServerConfig(default_episode_timeout_seconds=10.0))
    result = await server.serve_episode(ProbeRequest(sleep_seconds=30.0))
    assert result.outcome == "success"


class _BrokenHook(ProbeServer):
    def episode_timeout_seconds(self, request: ProbeRequest) -> float | None:
        raise KeyError("budget")


class _NegativeHook(ProbeServer):
    def episode_timeout_seconds(self, request: ProbeRequest) -> float | None:
        return -1.0


@pytest.mark.parametrize(("server_type", "mentions"), [(_BrokenHook, "KeyError"), (_NegativeHook, "-1.0")])
async def test_a_failing_timeout_hook_fails_the_episode_before_it_starts(
    server_type: type[ProbeServer], mentions: str
) -> None:
    server = server_type(
        EnvironmentServerConfig(max_concurrent_episodes=1, admission_timeout_seconds=60.0, max_queued_episodes=0)
    )

    result = await server.serve_episode(ProbeRequest(episode_id="a"))

    failure = result.response.failure
    assert failure is not None
    assert failure.stage == "episode_timeout"
    assert failure.terminal is True
    assert mentions in failure.reason
    assert server.started == 0  # nothing of the episode ran
    # the slot was released: with one slot and no queue, another episode is admitted at once
    assert (await server.serve_episode(ProbeRequest(episode_id="b"))).http_status == 200


async def test_an_unhandled_exception_is_a_terminal_failure_without_a_traceback() -> None:
    server = ProbeServer()
    result = await server.serve_episode(ProbeRequest(episode_id="bug", fail="unhandled"))

    failure = result.response.failure
    assert failure is not None
    assert failure.terminal is True
    assert failure.kind == "unhandled_exception"
    assert failure.reason == "KeyError: 'reward'"
    assert result.response.failure_report is not None
    assert result.response.failure_report.event.error_type == "KeyError"
    assert server.cleaned == ["bug"]
    assert _count(server, "environment_episodes_total", outcome="failed") == 1


async def test_a_handled_failure_reaches_the_reply_with_its_report_beside_it() -> None:
    server = ProbeServer()
    result = await server.serve_episode(ProbeRequest(fail="handled"))

    assert result.response.failure is not None
    assert result.response.failure.stage == "verify"
    assert result.response.failure.terminal is True
    report = result.response.failure_report
    assert report is not None
    assert report.event.reason == "the answer is not a number"
    assert report.terminal is True


@pytest.mark.parametrize(("fail", "retryable"), [("dependency-retryable", "true"), ("dependency-terminal", "false")])
async def test_dependency_failures_are_counted_by_retryability(fail: str, retryable: str) -> None:
    server = ProbeServer()
    result = await server.serve_episode(ProbeRequest(fail=fail))

    assert result.response.failure is not None
    assert result.response.failure.terminal is (retryable == "false")
    assert _count(server, "environment_dependency_failures_total", retryable=retryable) == 1
    assert (
        _count(server, "environment_dependency_failures_total", retryable="true" if retryable == "false" else "false")
        == 0
    )


async def test_a_cancelled_episode_still_runs_its_cleanup_and_leaves_no_trace() -> None:
    server = ProbeServer()
    task = asyncio.create_task(server.serve_episode(ProbeRequest(episode_id="gone", hold=True)))
    await until(lambda: server.running == 1)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert server.cleaned == ["gone"]
    assert server.episodes == set()
    assert server.limiter.running == 0
    assert _count(server, "environment_episodes_total", outcome="failed") == 1
