"""A fleet of real vLLM servers with the chaos surface of the sim fleet, for the demo and the benchmarks.

The chaos injector (:class:`~rollout_runtime.sim.chaos.FaultInjector`) drives a fleet through a few verbs; on vLLM
each is the real process fault a user's fleet sees:

- ``kill``: SIGKILL of the server's whole process group (API server and engine core: a node or a pod dying);
  ``restart`` brings it back on the same port with the base weights (so it is Stale until refit);
- ``hang``: SIGSTOP of the engine core only: ``/health`` keeps answering 200 while every generation hangs, which
  only a generate probe or an attempt's deadline can tell; ``resume`` is SIGCONT;
- the sim shard's injected answers (503 bursts, flapping, 429s, dropped connections, another model) have no vLLM
  equivalent: ``set_faults`` refuses them with :class:`UnsupportedFault`, which the injector reports as a fault that
  could not be applied.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from rollout_runtime.shards import Shard
from rollout_runtime.vllm.server import MODEL_NAME, VllmServer

__all__ = ["UnsupportedFault", "VllmFleet"]

START_TIMEOUT_SECONDS = 600.0
"""A cold start is 23-68 s on an idle 2-core machine; several at once beside a busy batch take minutes."""


class UnsupportedFault(NotImplementedError):
    """A fault the sim shard can inject into its answers that a real vLLM server has no way to take."""


class VllmFleet:
    """``count`` vLLM servers named ``<prefix><i>`` serving ``model_dir``; ``async with`` starts and stops them."""

    model = MODEL_NAME

    def __init__(self, count: int, python: Path, model_dir: Path, log_dir: Path, *, name_prefix: str = "vllm-") -> None:
        self.servers = {
            f"{name_prefix}{i}": VllmServer(f"{name_prefix}{i}", python, model_dir, log_dir / f"{name_prefix}{i}.log")
            for i in range(count)
        }

    @property
    def names(self) -> list[str]:
        return list(self.servers)

    @property
    def shards(self) -> list[Shard]:
        return [self.shard(name) for name in self.servers]

    def shard(self, name: str) -> Shard:
        return Shard(name=name, endpoint=self.servers[name].url, model=MODEL_NAME)

    def alive(self, name: str) -> bool:
        return self.servers[name].running

    async def __aenter__(self) -> VllmFleet:
        try:
            for server in self.servers.values():
                server.start()
            await asyncio.gather(*(s.wait_ready(START_TIMEOUT_SECONDS) for s in self.servers.values()))
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop() for server in self.servers.values()))

    async def kill(self, name: str) -> int | None:
        """SIGKILL the server's whole group and wait until it is gone; the exit status is not known (None)."""
        server = self.servers[name]
        server.signal_group(signal.SIGKILL)
        await server.stop()
        return None

    def hang(self, name: str) -> None:
        self.servers[name].freeze_engine()

    def resume(self, name: str) -> None:
        self.servers[name].thaw_engine()

    async def restart(self, name: str) -> Shard:
        """Stop the server if it runs, start it on the same port, wait for ``/health``: base weights again."""
        server = self.servers[name]
        await server.stop()
        server.start()
        await server.wait_ready(START_TIMEOUT_SECONDS)
        return self.shard(name)

    async def set_faults(self, name: str, *args: Any, **fields: Any) -> Any:
        raise UnsupportedFault(f"{name}: a real vLLM server cannot be made to answer {fields or args} on demand")
