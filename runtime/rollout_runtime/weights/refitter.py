"""Refit helpers for trainers: SGLang's ``update_weights_from_disk`` and vLLM's dev-mode reload as update
functions, and a loop that refits every shard that came back Stale.

A restarted shard is Stale until refit (:mod:`.tracker`); a trainer that refits only at its own steps leaves it out
of traffic until the next step. :class:`StaleRefitter` closes that gap: it refits a Stale shard, at the current
policy version, as soon as its probes say it is up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

import aiohttp

from rollout_runtime.health.hysteresis import HealthPhase
from rollout_runtime.weights.tracker import RefitError, WeightsTracker

__all__ = ["StaleRefitter", "update_weights_from_disk", "vllm_reload_weights"]

log = logging.getLogger(__name__)

Update = Callable[[str, int], Awaitable[object]]
"""``update(shard, version)``: push policy ``version``'s weights to the shard; raise if it failed."""


async def update_weights_from_disk(
    session: aiohttp.ClientSession, endpoint: str, model_path: str, version: int, *, timeout_seconds: float = 600.0
) -> None:
    """SGLang's ``POST /update_weights_from_disk`` with ``weight_version`` (the sim shard speaks it too); raises
    :class:`RefitError` unless the server answers 200 with ``success`` true."""
    body = {"model_path": model_path, "weight_version": str(version)}
    try:
        async with asyncio.timeout(timeout_seconds):
            async with session.post(f"{endpoint}/update_weights_from_disk", json=body) as response:
                answer = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise RefitError(f"update_weights_from_disk on {endpoint} failed: {type(exc).__name__}: {exc}") from exc
    if response.status != 200 or not isinstance(answer, dict) or not answer.get("success"):
        message = answer.get("message") if isinstance(answer, dict) else answer
        raise RefitError(f"update_weights_from_disk on {endpoint} answered {response.status}: {message}")


async def vllm_reload_weights(
    session: aiohttp.ClientSession, endpoint: str, weights_path: str, version: int, *, timeout_seconds: float = 600.0
) -> None:
    """A refit through vLLM's own dev-mode endpoints (``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=wait`` (in-flight
    requests finish, new ones wait), ``POST /collective_rpc`` ``reload_weights`` from ``weights_path`` (an in-place
    reload from disk), ``POST /update_weight_version``, ``POST /resume``; then ``GET /weight_info`` must read
    ``version`` back. Raises :class:`RefitError` naming the step that failed; the server is resumed whatever
    happened after the pause (a paused vLLM blocks new requests instead of failing them). Each request closes its
    connection: vLLM drops a keep-alive connection silently after a 500 from a dev endpoint."""
    close = {"Connection": "close"}

    async def step(method: str, path: str, body: Mapping[str, object] | None = None) -> object:
        try:
            async with session.request(method, f"{endpoint}{path}", json=body, headers=close) as response:
                answer = await response.json(content_type=None)
        except (aiohttp.ClientError, ValueError) as exc:
            raise RefitError(f"vLLM {path} on {endpoint} failed: {type(exc).__name__}: {exc}") from exc
        if response.status != 200:
            raise RefitError(f"vLLM {path} on {endpoint} answered {response.status}: {answer}")
        return answer

    try:
        async with asyncio.timeout(timeout_seconds):
            await step("POST", "/pause?mode=wait")
            try:
                reload = {"method": "reload_weights", "kwargs": {"weights_path": weights_path}}
                await step("POST", "/collective_rpc", reload)
                await step("POST", "/update_weight_version", {"new_version": str(version)})
            finally:
                await step("POST", "/resume")
            info = await step("GET", "/weight_info")
    except TimeoutError as exc:
        raise RefitError(f"vLLM refit on {endpoint} took longer than {timeout_seconds:g} s") from exc
    read_back = info.get("weight_version") if isinstance(info, dict) else None
    if read_back != str(version):
        raise RefitError(f"vLLM on {endpoint} reports weights {read_back!r} after the refit to {version}")


class StaleRefitter:
    """Refits Stale shards whose probes say they are up, at the tracker's policy version, one refit per shard at a
    time. ``refits`` and ``failures`` count what it did."""

    def __init__(self, tracker: WeightsTracker, update: Update, *, on_refit: Callable[[str, int], None] | None = None):
        self._tracker = tracker
        self._update = update
        self._on_refit = on_refit
        self._running: dict[str, asyncio.Task[None]] = {}
        self.refits = 0
        self.failures = 0

    def due(self) -> list[str]:
        """Shards Stale (not Refitting, not already being refit here) whose probes say Healthy or Suspect."""
        states = self._tracker.host_states()
        return [
            name
            for name, state in states.items()
            if state.phase is HealthPhase.STALE and state.health_phase.serving and name not in self._running
        ]

    def kick(self) -> None:
        """Start a refit for every shard that is due (call it often: after each outcome, on a timer)."""
        version = self._tracker.policy_version
        if version is None:
            return
        for name in self.due():
            self._running[name] = asyncio.create_task(self._refit(name, version), name=f"refit-{name}")

    async def _refit(self, name: str, version: int) -> None:
        try:
            async with self._tracker.refit(name, version):
                await self._update(name, version)
            self.refits += 1
            if self._on_refit is not None:
                self._on_refit(name, version)
        except Exception as exc:  # stays Stale; the next kick retries
            self.failures += 1
            log.warning("refit of stale shard %s failed: %s", name, exc)
        finally:
            self._running.pop(name, None)

    async def settle(self, timeout_seconds: float, *, period_seconds: float = 0.2) -> bool:
        """Between steps: poll identities and refit until every shard is up and not Stale, or ``timeout_seconds``
        passed; return whether the fleet settled (a shard that stays down keeps it from settling)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while True:
            await self._tracker.poll()
            self.kick()
            if self._running:
                await asyncio.gather(*self._running.values(), return_exceptions=True)
                continue
            states = self._tracker.host_states().values()
            if all(state.health_phase.serving and not state.stale for state in states):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(period_seconds)  # waiting on a remote process's probes: nothing to await

    async def run(self, period_seconds: float) -> None:
        """Kick every ``period_seconds`` until cancelled."""
        while True:
            self.kick()
            await asyncio.sleep(period_seconds)

    async def aclose(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
