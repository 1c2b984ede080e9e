"""A fleet of real vLLM servers with the chaos surface of the sim fleet, for the demo and the benchmarks.

The chaos injector (:class:`~rollout_runtime.sim.chaos.FaultInjector`) drives a fleet through a few verbs; on vLLM
each is the real process fault a user's fleet sees:

- ``kill``: SIGKILL of the server's whole process group (API server and engine core: a node or a pod dying);
  ``restart`` brings it back on the same port with the base weights (so it is Stale until refit);
- ``hang``: SIGSTOP of the engine core only: ``/health`` keeps answering 200 while every generation hangs, which
  only a generate probe or an attempt's deadline can tell; ``resume`` is SIGCONT;
- ``terminate``: SIGTERM of the API server, as a Deployment's rolling update sends (a
  :class:`~rollout_runtime.sim.chaos.GracefulFleet`): vLLM drains what is in flight when started with
  ``--shutdown-timeout N`` and fails it with 500 without; the whole group exits;
- the sim shard's injected answers (503 bursts, flapping, 429s, dropped connections, another model) have no vLLM
  equivalent: ``set_faults`` refuses them with :class:`UnsupportedFault`, which the injector reports as a fault that
  could not be applied.

A benchmark runs every contender against one fleet (a start is 20-70 s), so the fleet also says what it served
(:meth:`VllmFleet.stats`: vLLM's own Prometheus counters) and brings itself back to health between runs
(:meth:`VllmFleet.restore`: restart what is dead, thaw what is frozen, and wait until each answers a real 1-token
generation, since ``/health`` alone does not prove a thawed engine generates).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from rollout_runtime.shards import Shard
from rollout_runtime.sim.process import until
from rollout_runtime.vllm.server import MODEL_NAME, VllmServer

__all__ = ["UnsupportedFault", "VllmFleet", "vllm_counters"]

START_TIMEOUT_SECONDS = 600.0
"""A cold start is 23-68 s on an idle 2-core machine; several at once beside a busy batch take minutes."""


class UnsupportedFault(NotImplementedError):
    """A fault the sim shard can inject into its answers that a real vLLM server has no way to take."""


class VllmFleet:
    """``count`` vLLM servers named ``<prefix><i>`` serving ``model_dir``; ``async with`` starts and stops them."""

    model = MODEL_NAME

    def __init__(
        self,
        count: int,
        python: Path,
        model_dir: Path,
        log_dir: Path,
        *,
        name_prefix: str = "vllm-",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.servers = {
            f"{name_prefix}{i}": VllmServer(
                f"{name_prefix}{i}", python, model_dir, log_dir / f"{name_prefix}{i}.log", extra_args=tuple(extra_args)
            )
            for i in range(count)
        }

    @classmethod
    def of(cls, servers: Mapping[str, VllmServer]) -> VllmFleet:
        """A fleet over servers someone else started and stops (the test tier's shared ones), under these names.
        Use it without ``async with``, which would start and stop them."""
        fleet = cls.__new__(cls)
        fleet.servers = dict(servers)
        return fleet

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

    async def terminate(self, name: str, grace_seconds: float = 30.0) -> tuple[int | None, dict[str, int]]:
        """SIGTERM the API server (a graceful stop) and wait until it and its engine core are gone, then sweep the
        group (its guard, and whatever outlived ``grace_seconds``). Returns no exit status (the API server is the
        guard's child, not ours) and :meth:`stats` read right before the signal: what the server finishes while it
        drains dies with its counters, so it is not in them."""
        server = self.servers[name]
        counters: dict[str, int] = {}
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            counters = await self.stats(name)

        def gone() -> bool:
            return not server.running and not server.engine_pids()

        server.terminate()
        with contextlib.suppress(TimeoutError):  # past the grace, stop() SIGKILLs what is left
            await until(gone, timeout_seconds=grace_seconds, what=f"{name} exiting on SIGTERM", interval=0.05)
        await server.stop()
        return None, counters

    async def restart(self, name: str) -> Shard:
        """Stop the server if it runs, start it on the same port, wait for ``/health``: base weights again."""
        server = self.servers[name]
        await server.stop()
        server.start()
        await server.wait_ready(START_TIMEOUT_SECONDS)
        return self.shard(name)

    async def stats(self, name: str, timeout_seconds: float = 5.0) -> dict[str, int]:
        """What the server served since it started, from its own ``/metrics`` (cumulative; zero after a restart):
        ``finished_<reason>`` (``vllm:request_success_total`` by ``finished_reason``: stop, length, abort, ...),
        ``http_<class>`` (``http_requests_total`` of ``/v1/completions`` by status class: 2xx, 4xx, 5xx),
        ``prompt_tokens`` and ``generation_tokens``."""
        timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        url = f"{self.servers[name].url}/metrics"
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as answer:
            answer.raise_for_status()
            text = await answer.text()
        return vllm_counters(text)

    async def generates(self, name: str, timeout_seconds: float = 10.0) -> bool:
        """Whether the server answers a real 1-token completion within the deadline (liveness a frozen engine cannot
        fake: its ``/health`` stays 200)."""
        body = {"model": MODEL_NAME, "prompt": "ready", "max_tokens": 1, "temperature": 0}
        timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        url = f"{self.servers[name].url}/v1/completions"
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url, json=body) as answer:
                return answer.status == 200 and bool((await answer.json()).get("choices"))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False

    async def restore(self, timeout_seconds: float = START_TIMEOUT_SECONDS) -> list[str]:
        """Bring every server back to health: thaw frozen engines, restart dead or non-generating servers, until each
        answers a 1-token generation. Returns the names restarted (what the last run left broken)."""
        restarted: list[str] = []

        async def one(name: str) -> None:
            server = self.servers[name]
            if server.running:
                with contextlib.suppress(RuntimeError):
                    server.thaw_engine()
            if server.running and await server.healthy() and await self.generates(name):
                return
            restarted.append(name)
            await self.restart(name)
            if not await self.generates(name, timeout_seconds):
                raise RuntimeError(f"{name} answers /health but no generation after a restart; log {server.log_path}")

        await asyncio.gather(*(one(name) for name in self.servers))
        return restarted

    async def set_faults(self, name: str, *args: Any, **fields: Any) -> Any:
        raise UnsupportedFault(f"{name}: a real vLLM server cannot be made to answer {fields or args} on demand")


_FINISHED = "vllm:request_success"
_HTTP = "http_requests"
_TOKENS = {"vllm:prompt_tokens": "prompt_tokens", "vllm:generation_tokens": "generation_tokens"}


def vllm_counters(text: str) -> dict[str, int]:
    """The counters :meth:`VllmFleet.stats` reports, from a ``/metrics`` page (samples of every label set summed)."""
    counters: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if family.name == _FINISHED:
                key = f"finished_{sample.labels.get('finished_reason', 'unknown')}"
            elif family.name == _HTTP and sample.labels.get("handler") == "/v1/completions":
                key = f"http_{sample.labels.get('status', 'unknown')}"
            elif family.name in _TOKENS:
                key = _TOKENS[family.name]
            else:
                continue
            counters[key] = counters.get(key, 0) + int(sample.value)
    return counters
