"""Helpers for environment-server tests: a controllable in-process server, and a yield-until helper.

Plain helpers (no fixtures), imported as ``support.environment``; fixtures live in the test modules.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from rollout_runtime.environment import (
    BaseEnvironmentServer,
    EnvironmentServerConfig,
    EpisodeContext,
    EpisodeRequest,
    EpisodeResponse,
    dependency_episode_failure,
    handled_episode_failure,
)
from rollout_runtime.sim.env_process import SimEnvProcess


@contextlib.asynccontextmanager
async def killed_at_exit() -> AsyncIterator[list[SimEnvProcess]]:
    """A list for the sim-env processes a test starts; every one is killed (by pid) when the block ends."""
    started: list[SimEnvProcess] = []
    try:
        yield started
    finally:
        for process in started:
            await process.kill()


async def until(predicate: Callable[[], bool], *, yields: int = 10_000) -> None:
    """Yield to the loop until ``predicate()`` holds: no wall-clock or loop-time sleeping, bounded."""
    for _ in range(yields):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached after yielding to the loop")


class ProbeRequest(EpisodeRequest):
    hold: bool = False
    """Block until the test sets ``server.release``."""
    sleep_seconds: float = 0.0
    fail: str | None = None
    """"handled", "unhandled", "dependency-retryable", "dependency-terminal"."""


class ProbeServer(BaseEnvironmentServer[ProbeRequest, EpisodeResponse]):
    """Runs episodes the test controls, counting concurrency and cleanups."""

    protocol_name = "probe"
    request_model = ProbeRequest
    response_model = EpisodeResponse

    def __init__(self, config: EnvironmentServerConfig | None = None, **kwargs: object) -> None:
        super().__init__(config, **kwargs)  # type: ignore[arg-type]
        self.release = asyncio.Event()
        self.running = 0
        self.max_running = 0
        self.started = 0
        self.cleaned: list[str] = []

    async def run_episode(self, request: ProbeRequest, episode: EpisodeContext) -> EpisodeResponse:
        self.started += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        episode.register_cleanup(lambda: self.cleaned.append(request.episode_id), name="probe")
        try:
            if request.hold:
                await self.release.wait()
            if request.sleep_seconds:
                await asyncio.sleep(request.sleep_seconds)
            if request.fail == "handled":
                raise handled_episode_failure("verify", "the answer is not a number", terminal=True)
            if request.fail == "unhandled":
                raise KeyError("reward")
            if request.fail == "dependency-retryable":
                raise dependency_episode_failure(ConnectionRefusedError("refused"), stage="tool")
            if request.fail == "dependency-terminal":
                raise dependency_episode_failure(ValueError("reply failed validation"), stage="tool")
            return EpisodeResponse(episode_id=request.episode_id, reward=1.0)
        finally:
            self.running -= 1
