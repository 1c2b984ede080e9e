"""Seeded fault schedules for a simulated fleet, and the injector that applies them to real processes.

A :class:`FaultSchedule` is a list of :class:`Fault` s, each triggered when a run has finished a fraction of its
prompts (progress, not wall time, so a slow machine sees the same faults at the same point of the run) and held for
a number of seconds (time, because some faults stop progress: with every shard down nothing finishes).
``FaultSchedule.generate(seed, shards)`` draws one reproducibly: the same seed and shards give the same schedule.

:class:`FaultInjector` applies a schedule to a :class:`~rollout_runtime.sim.fleet.SimFleet` (SIGKILL, SIGSTOP and
SIGCONT of real shard processes, runtime faults through each shard's admin endpoint) and to environment servers
(SIGKILL mid-episode after a checkpoint, then a restart on the same port with the same checkpoint directory).
Faults on one target never overlap: each waits for the previous fault on its target to end. Every applied fault is
recorded as an :class:`InjectedFault` with its loop-time window, so a report can charge failures to it.

Used by the chaos suite (tests/chaos) and reusable by demos: ``FaultInjector(fleet, environments).advance(0.3)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Protocol

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from rollout_runtime.sim.env_process import SimEnvProcess
    from rollout_runtime.sim.fleet import SimFleet

__all__ = [
    "ENV_TARGET",
    "FLEET_TARGET",
    "EnvironmentTarget",
    "Fault",
    "FaultInjector",
    "FaultKind",
    "FaultSchedule",
    "InjectedFault",
    "SimEnvTarget",
]

log = logging.getLogger(__name__)

FLEET_TARGET: Final[str] = "*"
"""The target of a fault that hits every shard at once."""
ENV_TARGET: Final[str] = "env"
"""The default name of the environment server target."""


class FaultKind(str, enum.Enum):
    """Every fault the chaos suite injects."""

    SHARD_KILL = "shard_kill"
    """SIGKILL a shard process; restart it on the same port after the hold."""
    SHARD_HANG = "shard_hang"
    """SIGSTOP a shard (the kernel still accepts connections, nothing answers); SIGCONT after the hold."""
    SHARD_SLOW = "shard_slow"
    """Add latency to every generation request of a shard for the hold."""
    ERROR_BURST_5XX = "error_burst_5xx"
    """The next ``count`` generation requests of a shard fail with a 5xx."""
    RATE_LIMIT_429 = "rate_limit_429"
    """The next ``count`` generation requests of a shard fail with 429 Too Many Requests."""
    CONNECTION_DROP = "connection_drop"
    """The next ``count`` generation responses of a shard are cut off mid-body (the connection closes)."""
    WRONG_MODEL = "wrong_model"
    """A shard serves another model for the hold (its probes and requests see the wrong name)."""
    ENV_CRASH = "env_crash"
    """Checkpoint the environment server, SIGKILL it mid-episode, restart it with the same checkpoint directory."""
    ALL_SHARDS_DOWN = "all_shards_down"
    """SIGKILL every shard; restart them all after the hold."""


_SHARD_KINDS: Final[frozenset[FaultKind]] = frozenset(
    {
        FaultKind.SHARD_KILL,
        FaultKind.SHARD_HANG,
        FaultKind.SHARD_SLOW,
        FaultKind.ERROR_BURST_5XX,
        FaultKind.RATE_LIMIT_429,
        FaultKind.CONNECTION_DROP,
        FaultKind.WRONG_MODEL,
    }
)
_5XX: Final[tuple[int, ...]] = (500, 502, 503, 504)


class Fault(BaseModel):
    """One fault: what, on which target, when (fraction of prompts finished) and for how long."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FaultKind
    target: str
    """A shard name, :data:`FLEET_TARGET` for every shard, or an environment target's name."""
    at_progress: Annotated[float, Field(ge=0, le=1)]
    """Start once this fraction of the run's prompts has finished."""
    hold_seconds: Annotated[float, Field(ge=0, le=3600)] = 0.0
    """How long the fault lasts; a burst ends after ``count`` requests or this long, whichever comes first."""
    count: Annotated[int, Field(ge=0)] = 0
    """Requests hit by a burst (5xx, 429, dropped connections)."""
    status: Annotated[int, Field(ge=400, le=599)] | None = None
    """The HTTP status of an error burst."""
    slow_seconds: Annotated[float, Field(ge=0, le=60)] = 0.0

    def describe(self) -> str:
        what = {
            FaultKind.SHARD_KILL: f"SIGKILL, restart after {self.hold_seconds:g}s",
            FaultKind.SHARD_HANG: f"SIGSTOP for {self.hold_seconds:g}s, then SIGCONT",
            FaultKind.SHARD_SLOW: f"+{self.slow_seconds:g}s per request for {self.hold_seconds:g}s",
            FaultKind.ERROR_BURST_5XX: f"next {self.count} requests answer {self.status} (<= {self.hold_seconds:g}s)",
            FaultKind.RATE_LIMIT_429: f"next {self.count} requests answer HTTP 429 (<= {self.hold_seconds:g}s)",
            FaultKind.CONNECTION_DROP: f"next {self.count} responses cut off mid-body (<= {self.hold_seconds:g}s)",
            FaultKind.WRONG_MODEL: f"serves another model for {self.hold_seconds:g}s",
            FaultKind.ENV_CRASH: "checkpoint, SIGKILL mid-episode, restart from the checkpoint directory",
            FaultKind.ALL_SHARDS_DOWN: f"SIGKILL every shard, restart all after {self.hold_seconds:g}s",
        }[self.kind]
        return f"{self.kind.value} on {self.target} at {self.at_progress:.0%}: {what}"


class FaultSchedule(BaseModel):
    """The faults of one scenario, sorted by when they start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int | None = None
    faults: tuple[Fault, ...] = ()

    def kinds(self) -> Counter[str]:
        return Counter(f.kind.value for f in self.faults)

    @classmethod
    def of(cls, faults: Sequence[Fault], seed: int | None = None) -> FaultSchedule:
        return cls(seed=seed, faults=tuple(sorted(faults, key=lambda f: f.at_progress)))

    @classmethod
    def generate(
        cls,
        seed: int,
        shards: Sequence[str],
        *,
        kinds: Sequence[FaultKind] = tuple(FaultKind),
        per_kind: int = 1,
        environment: str | None = ENV_TARGET,
        start: float = 0.05,
        end: float = 0.8,
        hold_seconds: tuple[float, float] = (0.5, 1.5),
        burst: tuple[int, int] = (5, 30),
        hang_extra_seconds: float = 1.5,
    ) -> FaultSchedule:
        """Draw a schedule: ``per_kind`` faults of each kind at random progress points in ``[start, end]``.

        Deterministic in its arguments. Shard faults pick a random shard; ENV_CRASH targets ``environment`` (left
        out when None); ALL_SHARDS_DOWN targets every shard. A hang is held ``hang_extra_seconds`` longer, so that
        it outlasts the probes' detection time rather than being a mere stall.
        """
        if not shards:
            raise ValueError("a schedule needs at least one shard")
        if not 0 <= start <= end <= 1:
            raise ValueError("need 0 <= start <= end <= 1")
        rng = random.Random(seed)
        faults: list[Fault] = []
        for kind in kinds:
            if kind is FaultKind.ENV_CRASH and environment is None:
                continue
            for _ in range(per_kind):
                at = round(rng.uniform(start, end), 4)
                hold = round(rng.uniform(*hold_seconds), 3)
                if kind is FaultKind.SHARD_HANG:  # long enough for probes to see it (a brief stall is only slow)
                    hold = round(hold + hang_extra_seconds, 3)
                if kind is FaultKind.ENV_CRASH:
                    faults.append(Fault(kind=kind, target=environment or ENV_TARGET, at_progress=at))
                elif kind is FaultKind.ALL_SHARDS_DOWN:
                    faults.append(Fault(kind=kind, target=FLEET_TARGET, at_progress=at, hold_seconds=hold))
                else:
                    target = rng.choice(list(shards))
                    count = rng.randint(*burst)
                    faults.append(
                        Fault(
                            kind=kind,
                            target=target,
                            at_progress=at,
                            hold_seconds=hold,
                            count=count if kind in _BURST_KINDS else 0,
                            status=rng.choice(_5XX) if kind is FaultKind.ERROR_BURST_5XX else None,
                            slow_seconds=round(rng.uniform(0.1, 0.4), 3) if kind is FaultKind.SHARD_SLOW else 0.0,
                        )
                    )
        return cls.of(faults, seed=seed)


_BURST_KINDS: Final[frozenset[FaultKind]] = frozenset(
    {FaultKind.ERROR_BURST_5XX, FaultKind.RATE_LIMIT_429, FaultKind.CONNECTION_DROP}
)


class EnvironmentTarget(Protocol):
    """An environment server the injector can crash mid-episode and bring back."""

    async def checkpoint(self) -> list[str]:
        """Open a checkpoint; return the episode ids it exported (episodes stay parked)."""
        ...

    async def crash(self) -> None:
        """SIGKILL the server (no cleanup runs)."""
        ...

    async def restart(self) -> None:
        """Start it again at the same URL, continuing from its checkpoint directory."""
        ...


class SimEnvTarget:
    """A ``rollout-fleet sim-env`` subprocess the injector may crash and restart on the same port.

    ``url`` stays valid across restarts (same host and port, same checkpoint directory).
    """

    def __init__(
        self, kind: str, *, checkpoint_dir: Path | None = None, extra_args: tuple[str, ...] = (), name: str = ENV_TARGET
    ) -> None:
        self.kind = kind
        self.name = name
        self.checkpoint_dir = checkpoint_dir
        self.extra_args = extra_args
        self.process: SimEnvProcess | None = None
        self.port = 0
        self.restarts = 0

    @property
    def url(self) -> str:
        if self.process is None:
            raise RuntimeError(f"environment {self.name} has not started")
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> SimEnvTarget:
        from rollout_runtime.sim.env_process import spawn_env_server

        self.process = await spawn_env_server(
            self.kind, checkpoint_dir=self.checkpoint_dir, port=self.port, extra_args=self.extra_args
        )
        self.port = self.process.port
        return self

    async def checkpoint(self) -> list[str]:
        from rollout_runtime.environment import EnvironmentClient

        async with EnvironmentClient(self.url, timeout_seconds=30.0) as client:
            manifest = await client.open_checkpoint()
        return sorted(manifest.episodes)

    async def crash(self) -> None:
        if self.process is not None:
            await self.process.kill()

    async def restart(self) -> None:
        if self.process is not None and self.process.running:
            await self.process.kill()
        self.restarts += 1
        await self.start()

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()
            with contextlib.suppress(OSError):
                self.process.log_path.unlink()

    async def __aenter__(self) -> SimEnvTarget:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


@dataclass
class InjectedFault:
    """A fault that was applied: its loop-time window and what it did."""

    fault: Fault
    started: float
    ended: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    applied: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set once the fault is in effect (the shard is dead, hung, erroring...), before it is held."""

    def covers(self, when: float, grace: float = 0.0) -> bool:
        """Whether loop time ``when`` falls in the fault's window (extended by ``grace`` after it ended)."""
        end = self.ended if self.ended is not None else float("inf")
        return self.started <= when <= end + grace

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.fault.kind.value,
            "target": self.fault.target,
            "at_progress": self.fault.at_progress,
            "description": self.fault.describe(),
            "seconds": None if self.ended is None else round(self.ended - self.started, 3),
            **self.detail,
        }


class FaultInjector:
    """Applies a :class:`FaultSchedule` to a fleet as a run progresses: call :meth:`advance` with the progress.

    ``advance`` starts every fault whose trigger was reached (each in its own task, serialised per target) and
    returns at once; :meth:`close` cancels faults not yet finished and undoes what they did (resumes hung shards,
    restarts killed ones, clears runtime faults), so nothing is left broken behind a run.
    """

    def __init__(
        self,
        fleet: SimFleet,
        schedule: FaultSchedule,
        *,
        environments: Mapping[str, EnvironmentTarget] | None = None,
    ) -> None:
        self.fleet = fleet
        self.schedule = schedule
        self.environments = dict(environments or {})
        self.injected: list[InjectedFault] = []
        self.errors: list[str] = []
        self._pending = list(schedule.faults)
        self._tasks: set[asyncio.Task[None]] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._applied = 0
        self._applied_changed = asyncio.Event()
        for fault in schedule.faults:
            if fault.kind is FaultKind.ENV_CRASH and fault.target not in self.environments:
                raise ValueError(f"{fault.describe()}: no environment target named {fault.target!r}")
            if fault.kind in _SHARD_KINDS and fault.target not in fleet.names:
                raise ValueError(f"{fault.describe()}: no shard named {fault.target!r}")

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def active(self) -> int:
        return sum(1 for task in self._tasks if not task.done())

    def advance(self, progress: float) -> None:
        """Start every pending fault whose ``at_progress`` is at most ``progress``."""
        while self._pending and self._pending[0].at_progress <= progress:
            fault = self._pending.pop(0)
            task = asyncio.create_task(self._run(fault), name=f"chaos-{fault.kind.value}-{fault.target}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def until_applied(self, count: int) -> None:
        """Wait until ``count`` faults are in effect (or were: a fault that could not be applied counts too)."""
        while self._applied < count:
            self._applied_changed.clear()
            await self._applied_changed.wait()

    async def wait(self) -> None:
        """Wait for every started fault to end (and be undone)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Drop faults not started; cancel running ones (each undoes itself); wait for them."""
        self._pending.clear()
        for task in list(self._tasks):
            task.cancel()
        await self.wait()

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _run(self, fault: Fault) -> None:
        names = list(self.fleet.names) if fault.target == FLEET_TARGET else [fault.target]
        async with contextlib.AsyncExitStack() as locks:
            for name in sorted(names):
                await locks.enter_async_context(self._lock(name))
            loop = asyncio.get_running_loop()
            record = InjectedFault(fault, started=loop.time())
            self.injected.append(record)
            try:
                await self._apply(fault, record)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a fault that could not be applied is reported, never fatal to the run
                log.exception("chaos: %s failed", fault.describe())
                self.errors.append(f"{fault.describe()}: {type(exc).__name__}: {exc}")
                record.detail["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                record.ended = loop.time()
                self._mark_applied(record)

    def _mark_applied(self, record: InjectedFault) -> None:
        if not record.applied.is_set():
            record.applied.set()
            self._applied += 1
            self._applied_changed.set()

    async def _apply(self, fault: Fault, record: InjectedFault) -> None:
        fleet, name, kind = self.fleet, fault.target, fault.kind
        if kind is FaultKind.SHARD_KILL:
            record.detail["exit_status"] = await fleet.kill(name)
            await self._hold_then(record, self._restart(name))
        elif kind is FaultKind.SHARD_HANG:
            fleet.hang(name)
            self._mark_applied(record)
            try:
                await asyncio.sleep(fault.hold_seconds)
            finally:
                fleet.resume(name)
        elif kind is FaultKind.SHARD_SLOW:
            await fleet.set_faults(name, slow_seconds=fault.slow_seconds)
            await self._hold_then(record, self._clear(name, slow_seconds=0.0))
        elif kind is FaultKind.CONNECTION_DROP:
            await fleet.set_faults(name, drop_next=fault.count)
            await self._hold_then(record, self._clear(name, drop_next=0))
        elif kind in _BURST_KINDS:
            status = 429 if kind is FaultKind.RATE_LIMIT_429 else (fault.status or 503)
            await fleet.set_faults(name, fail_next=fault.count, error_status=status)
            await self._hold_then(record, self._clear(name, fail_next=0))
        elif kind is FaultKind.WRONG_MODEL:
            await fleet.set_faults(name, wrong_model=f"{fleet.model}-imposter")
            await self._hold_then(record, self._clear(name, wrong_model=None))
        elif kind is FaultKind.ENV_CRASH:
            environment = self.environments[name]
            record.detail["checkpointed_episodes"] = await environment.checkpoint()
            await environment.crash()
            await environment.restart()
        elif kind is FaultKind.ALL_SHARDS_DOWN:
            names = [n for n in fleet.names if fleet.alive(n)]
            await asyncio.gather(*(fleet.kill(n) for n in names))
            record.detail["killed"] = names
            await self._hold_then(record, self._restart_all(names))
        else:  # pragma: no cover - the enum is closed
            raise AssertionError(kind)

    async def _hold_then(self, record: InjectedFault, undo: Any) -> None:
        """Hold the fault, then undo it; undo also when cancelled (a run that ends leaves nothing broken)."""
        fault = record.fault
        self._mark_applied(record)
        try:
            await asyncio.sleep(fault.hold_seconds)
        finally:
            await asyncio.shield(undo)

    async def _restart(self, name: str) -> None:
        await self.fleet.restart(name)

    async def _restart_all(self, names: Sequence[str]) -> None:
        await asyncio.gather(*(self.fleet.restart(n) for n in names))

    async def _clear(self, name: str, **fields: Any) -> None:
        if self.fleet.alive(name):
            await self.fleet.set_faults(name, **fields)
