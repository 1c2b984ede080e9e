"""A fleet of simulated shards as real subprocesses on 127.0.0.1, for the demo, integration tests and benchmarks.

Each shard is ``python -m rollout_runtime.cli.sim_shard --port 0 --exit-with-parent`` run as a
:class:`~rollout_runtime.sim.process.ManagedProcess`; the fleet reads the port from the shard's ``SIM_SHARD_READY``
line, then waits for ``/health``. Chaos is real: :meth:`SimFleet.kill` sends SIGKILL, :meth:`SimFleet.hang` SIGSTOP
(the kernel still accepts connections, nobody answers), :meth:`SimFleet.resume` SIGCONT; :meth:`SimFleet.restart`
brings a shard back on the same port, so its :class:`Shard` stays valid. Leaving the ``async with`` block stops
every process by the pid the fleet started (SIGCONT, SIGTERM, then SIGKILL), and a shard whose parent dies exits by
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from rollout_runtime.shards.model import Shard
from rollout_runtime.sim.process import ManagedProcess, tail, until
from rollout_runtime.sim.shard import FINAL_STATS, READY_PREFIX, SimFaults

__all__ = ["SimFleet", "SimFleetError", "SimShardProcess"]


class SimFleetError(RuntimeError):
    """A sim shard failed to start or to take an order; the message includes the tail of its log."""


@dataclass
class SimShardProcess:
    """One shard: its Shard record, its port (kept across restarts) and its process."""

    shard: Shard
    port: int
    process: ManagedProcess
    args: tuple[str, ...] = ()

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.running

    @property
    def stopped(self) -> bool:
        """True while SIGSTOPped by :meth:`SimFleet.hang`."""
        return self.process.stopped


class SimFleet:
    """``async with SimFleet(3) as fleet:`` -- ``fleet.shards`` are running sim shards; chaos by name."""

    def __init__(
        self,
        count: int = 3,
        *,
        model: str = "sim-model",
        max_model_len: int = 4096,
        name_prefix: str = "shard-",
        faults: Mapping[str, SimFaults] | None = None,
        extra_args: Sequence[str] = (),
        seed: int = 0,
        log_dir: Path | None = None,
        startup_timeout: float = 30.0,
        python: str = sys.executable,
    ) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        self.count = count
        self.model = model
        self.max_model_len = max_model_len
        self.name_prefix = name_prefix
        self._initial_faults = dict(faults or {})
        self._extra_args = tuple(extra_args)
        self._seed = seed
        self._own_log_dir = log_dir is None
        self._log_dir = log_dir
        self._startup_timeout = startup_timeout
        self._python = python
        self._members: dict[str, SimShardProcess] = {}
        self._session: aiohttp.ClientSession | None = None
        unknown = set(self._initial_faults) - set(self.names)
        if unknown:
            raise ValueError(f"faults given for unknown shards: {sorted(unknown)}; names are {self.names}")

    @property
    def names(self) -> list[str]:
        return [f"{self.name_prefix}{i}" for i in range(self.count)]

    @property
    def shards(self) -> list[Shard]:
        """The shards, in name order (endpoints stay the same across restarts)."""
        return [self._members[name].shard for name in self.names if name in self._members]

    @property
    def log_dir(self) -> Path:
        if self._log_dir is None:
            raise RuntimeError("the fleet has not started")
        return self._log_dir

    def shard(self, name: str) -> Shard:
        return self._member(name).shard

    def pid(self, name: str) -> int | None:
        return self._member(name).pid

    def alive(self, name: str) -> bool:
        return self._member(name).alive

    def members(self) -> Mapping[str, SimShardProcess]:
        return dict(self._members)

    def _member(self, name: str) -> SimShardProcess:
        try:
            return self._members[name]
        except KeyError:
            raise KeyError(f"unknown sim shard {name!r}; known: {sorted(self._members)}") from None

    # ------------------------------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="sim-fleet-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        try:
            await asyncio.gather(*(self._start_new(name, index) for index, name in enumerate(self.names)))
        except BaseException:
            await self.stop()
            raise

    async def _start_new(self, name: str, index: int) -> None:
        args = [
            "--model",
            self.model,
            "--max-model-len",
            str(self.max_model_len),
            "--seed",
            str(self._seed + index),
            *self._extra_args,
        ]
        member = SimShardProcess(
            shard=Shard(name=name, endpoint="http://127.0.0.1:1", model=self.model, max_model_len=self.max_model_len),
            port=0,
            process=ManagedProcess(name, [], self.log_dir / f"{name}.log"),
            args=tuple(args),
        )
        self._members[name] = member
        await self._spawn(member)
        member.shard = Shard(
            name=name, endpoint=f"http://127.0.0.1:{member.port}", model=self.model, max_model_len=self.max_model_len
        )
        faults = self._initial_faults.get(name)
        if faults is not None:
            await self.set_faults(name, faults)

    async def _spawn(self, member: SimShardProcess) -> None:
        """Start the process, read its ready line (the port), wait for /health."""
        process = member.process
        process.argv = [
            self._python,
            "-m",
            "rollout_runtime.cli.sim_shard",
            "--port",
            str(member.port),
            "--exit-with-parent",
            *member.args,
        ]
        process.start()
        try:
            async with asyncio.timeout(self._startup_timeout):
                info = await process.wait_ready_line(READY_PREFIX, self._startup_timeout)
                member.port = int(info["port"])
                healthy = functools.partial(self._healthy, member)
                await until(healthy, timeout_seconds=self._startup_timeout, what="/health", process=process)
        except BaseException as exc:
            await process.stop_async(0.0)
            if isinstance(exc, TimeoutError | RuntimeError | OSError | ValueError | KeyError):
                raise SimFleetError(
                    f"sim shard {member.shard.name} did not become ready: {exc!r}\n{process.tail(20)}"
                ) from exc
            raise

    async def _healthy(self, member: SimShardProcess) -> bool:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._http().get(f"http://127.0.0.1:{member.port}/health") as response:
                return response.status == 200
        return False

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            raise RuntimeError("the fleet is not running")
        return self._session

    async def stop(self) -> None:
        """Stop every shard by pid; close the session; remove the log directory if the fleet made it."""
        await asyncio.gather(*(m.process.stop_async(2.0) for m in self._members.values()), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._own_log_dir and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    # ------------------------------------------------------------------------------------------ chaos

    async def kill(self, name: str) -> int | None:
        """SIGKILL the shard and wait for it to be gone; return its exit status."""
        return await self._member(name).process.kill_async()

    async def terminate(self, name: str, grace_seconds: float = 5.0) -> tuple[int | None, dict[str, int]]:
        """SIGTERM the shard (it stops listening and finishes its requests in flight) and wait for it to exit;
        SIGKILL it if it has not within ``grace_seconds``. Return its exit status and its counters after the drain
        (the last line it logged; empty if it wrote none)."""
        process = self._member(name).process
        status = await process.stop_async(grace_seconds)
        for line in reversed(tail(process.log_path, 20).splitlines()):
            if line.startswith(FINAL_STATS):
                counters: dict[str, int] = json.loads(line[len(FINAL_STATS) :])
                return status, counters
        return status, {}

    async def wait_exit(self, name: str) -> int | None:
        """Wait for the shard's process to exit by itself (after a crash fault); return its status."""
        process = self._member(name).process
        return await process.wait_async() if process.popen is not None else None

    def hang(self, name: str) -> None:
        """SIGSTOP the shard: connections are still accepted by the kernel, nothing answers."""
        try:
            self._member(name).process.hang()
        except RuntimeError as exc:
            raise SimFleetError(str(exc)) from None

    def resume(self, name: str) -> None:
        """SIGCONT a hung shard."""
        self._member(name).process.resume()

    async def restart(self, name: str, *, faults: SimFaults | None = None) -> Shard:
        """Kill the shard if it runs, start it again on the same port, wait until it answers /health."""
        member = self._member(name)
        await member.process.stop_async(0.0)
        await self._spawn(member)
        if faults is not None:
            await self.set_faults(name, faults)
        return member.shard

    async def set_faults(
        self, name: str, faults: SimFaults | None = None, *, replace: bool = False, **fields: Any
    ) -> SimFaults:
        """Change a running shard's faults through its admin endpoint (merge by default; ``replace`` resets
        unnamed fields). Pass a SimFaults, or fields such as ``hang=True``, ``fail_next=5``."""
        member = self._member(name)
        payload = (faults.model_dump(mode="json", exclude_unset=not replace) if faults is not None else {}) | fields
        url = f"http://127.0.0.1:{member.port}/admin/faults"
        request = self._http().put if replace else self._http().post
        async with request(url, json=payload) as response:
            body = await response.json()
            if response.status >= 400:
                raise SimFleetError(f"{name} refused faults {payload}: {body.get('error', body)}")
        if body.get("crashing"):
            return SimFaults(crash=True)
        return SimFaults.model_validate(body)

    async def stats(self, name: str) -> dict[str, int]:
        """The shard's request counters (``/admin/stats``): completions, dropped, errors_<status>, hung..."""
        async with self._http().get(f"http://127.0.0.1:{self._member(name).port}/admin/stats") as response:
            counters: dict[str, int] = await response.json()
            return counters

    async def clear_faults(self, names: Iterable[str] | None = None) -> None:
        """Reset faults to none on the given (default: all live) shards."""
        chosen = [n for n in (names if names is not None else self.names) if self._member(n).alive]
        await asyncio.gather(*(self.set_faults(n, SimFaults(), replace=True) for n in chosen))
