"""The field's own routers as benchmark peers: vLLM's ``vllm-router`` and SGLang's ``sglang-router`` (both Rust,
both from PyPI wheels), in front of OpenAI-compatible shards given as a static worker list.

``scripts/install-tools.sh router-peers`` installs both into one venv of the tool cache from a hash-pinned lock
(``tools/router-peers.lock``; versions in tools/versions.env). Each runs as a child process bound to 127.0.0.1,
its Prometheus listener on a free port of 127.0.0.1 too (its default, 29000, would collide between the two), and is
stopped by its pid when the ``async with`` block ends.

Configured as their docs recommend for production, every value set explicitly (their documented defaults differ
from what their CLIs do) and mirrored from the same :class:`~_peers.ProxySettings` as nginx and HAProxy get:

- ``--policy power_of_two``: the load-aware policy for traffic without shared prefixes (``cache_aware``, their
  default, is for prefix-heavy traffic and would measure its prefix tree, not the routing);
- retries on (``--retry-max-retries`` = the tries after the first; backoff from 50 ms), the circuit breaker on at
  its documented threshold (5 consecutive failures), active health checks on ``/health`` at the same period, timeout,
  fall and rise as the other contenders' probes;
- ``--request-timeout-secs`` = the per-attempt deadline (whole seconds: their CLIs take integers).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from _peers import PeerMissing, ProxySettings, _exited, _remove, _stop, _wait_port, installed_tool, pins
from rollout_runtime.sim.process import free_port

INSTALL = "bash scripts/install-tools.sh router-peers"
ROUTERS = ("vllm-router", "sglang-router")
CIRCUIT_BREAKER_FAILURES = 5
"""Consecutive failures that open a worker's breaker: the value both projects' production guides use."""


def _venv() -> Path:
    """The tool venv's ``bin/``; PeerMissing saying how to install it when it is not there."""
    versions = pins.versions()
    directory = f"router-peers-{versions['VLLM_ROUTER_VERSION']}-{versions['SGLANG_ROUTER_VERSION']}"
    python = installed_tool(directory, "python")
    if not isinstance(python, Path):
        raise PeerMissing(f"vllm-router and sglang-router are not installed at {python}: run `{INSTALL}`")
    return python.parent


def _whole(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def router_args(name: str, port: int, metrics_port: int, workers: Sequence[str], s: ProxySettings) -> list[str]:
    """The command line of ``name`` (one of :data:`ROUTERS`) in front of ``workers`` (their URLs)."""
    venv = _venv()
    program = [str(venv / "vllm-router")] if name == "vllm-router" else [str(venv / "python"), "-m"]
    if name == "sglang-router":
        program.append("sglang_router.launch_router")
    return [
        *program,
        "--host=127.0.0.1",
        f"--port={port}",
        "--worker-urls",
        *workers,
        "--policy=power_of_two",
        f"--request-timeout-secs={_whole(s.attempt_timeout)}",
        f"--retry-max-retries={max(0, s.tries - 1)}",
        "--retry-initial-backoff-ms=50",
        "--retry-max-backoff-ms=1000",
        f"--cb-failure-threshold={CIRCUIT_BREAKER_FAILURES}",
        "--cb-success-threshold=2",
        f"--cb-timeout-duration-secs={_whole(s.fail_timeout)}",
        "--health-check-endpoint=/health",
        f"--health-check-interval-secs={_whole(s.probe_period)}",
        f"--health-check-timeout-secs={_whole(s.probe_timeout)}",
        f"--health-failure-threshold={s.fall}",
        f"--health-success-threshold={s.rise}",
        "--worker-startup-timeout-secs=60",
        "--worker-startup-check-interval=1",
        "--prometheus-host=127.0.0.1",
        f"--prometheus-port={metrics_port}",
        "--log-level=warn" if name == "sglang-router" else "--log-level=warning",
    ]


class FieldRouter:
    """``async with FieldRouter("vllm-router", worker_urls, settings) as router:`` -- ``router.url``, ``router.pid``."""

    def __init__(self, name: str, workers: Sequence[str], settings: ProxySettings) -> None:
        if name not in ROUTERS:
            raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._args = router_args(name, self.port, free_port(), workers, settings)
        self._workers = len(workers)
        self._dir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        self._process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> FieldRouter:
        log = self._dir / "router.log"
        with log.open("wb") as out:
            self._process = await asyncio.create_subprocess_exec(
                *self._args, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, cwd=self._dir
            )
        try:
            await _wait_port(self.port, self._process, log, within=60.0)
            await self._wait_ready(log, within=60.0)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _wait_ready(self, log: Path, within: float) -> None:
        """Until ``/readiness`` says every worker is healthy: both listen before their first health checks, and
        sglang-router answers 503 "no available workers" until then."""
        deadline = time.monotonic() + within
        async with aiohttp.ClientSession() as http:
            while True:
                assert self._process is not None
                if self._process.returncode is not None:
                    raise _exited(self._process, log)
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(self.url + "/readiness") as response:
                        ready = await response.json(content_type=None) if response.status == 200 else {}
                        if ready.get("healthy_workers") == self._workers:
                            return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} had no healthy worker within {within:g}s (log: {log})")
                await asyncio.sleep(0.1)  # another process's state: there is no event to await

    @property
    def pid(self) -> int:
        assert self._process is not None, "use FieldRouter as `async with FieldRouter(...)`"
        return self._process.pid

    async def __aexit__(self, *exc_info: object) -> None:
        if self._process is not None:
            await _stop(self._process, 15)  # SIGTERM; SIGKILL after 5 s
        _remove(self._dir)
