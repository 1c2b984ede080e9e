"""The one chaos schedule model for the simulated fleet, and the injector that applies it to real processes.

A :class:`FaultSchedule` is a list of :class:`Fault` s. A fault starts when a run has finished a fraction of its
prompts (``at_progress``: progress, not wall time, so a slow machine sees the same faults at the same point of the
run) or, for a timeline that every contender of a benchmark must face alike, at a time (``at_seconds`` after
:meth:`FaultInjector.start_clock`). It lasts a number of seconds (``hold_seconds``: time, because some faults stop
progress: with every shard down nothing finishes) or until a later fraction of the prompts (``until_progress``).
``FaultSchedule.generate(seed, shards)`` draws one reproducibly: the same seed and shards give the same schedule.
A schedule is plain data: :meth:`FaultSchedule.active` says which timed faults hold a target at a given second, so
an in-process simulation (bench/dispatch_overhead.py) follows the same schedule without any process.

:class:`FaultInjector` applies a schedule to a :class:`ShardFleet`: a :class:`~rollout_runtime.sim.fleet.SimFleet`
(SIGKILL, SIGSTOP and SIGCONT of real shard processes, runtime faults through each shard's admin endpoint) or a
:class:`~rollout_runtime.vllm.fleet.VllmFleet` (the process faults on real vLLM servers), and to environment servers
(SIGKILL mid-episode after a checkpoint, then a restart on the same port with the same checkpoint directory).
Faults on one target never overlap: each waits for the previous fault on its target to end. Every applied fault is
recorded as an :class:`InjectedFault` with its loop-time window, so a report can charge failures to it.

Used by the chaos suite (tests/chaos), the demo (:mod:`rollout_runtime.demo`) and the benchmarks (bench/failover.py
on the wall clock, bench/dispatch_overhead.py in process): ``FaultInjector(fleet, schedule).advance(0.3)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from rollout_runtime.shards import Shard
    from rollout_runtime.sim.env_process import SimEnvProcess

__all__ = [
    "ENV_TARGET",
    "FLEET_TARGET",
    "GENERATED_KINDS",
    "EnvironmentTarget",
    "Fault",
    "FaultInjector",
    "FaultKind",
    "FaultSchedule",
    "GracefulFleet",
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
    """The next ``count`` generation requests of a shard fail with a 5xx (every request for the hold when ``count``
    is 0; with ``flap_seconds``, the shard flaps: ``/health`` and generation 503 every other ``flap_seconds``)."""
    RATE_LIMIT_429 = "rate_limit_429"
    """The next ``count`` generation requests of a shard fail with 429 Too Many Requests (0: all, for the hold)."""
    CONNECTION_DROP = "connection_drop"
    """The next ``count`` generation responses of a shard are cut off mid-body (0: all, for the hold)."""
    WRONG_MODEL = "wrong_model"
    """A shard serves another model for the hold (its probes and requests see the wrong name)."""
    ENV_CRASH = "env_crash"
    """Checkpoint the environment server, SIGKILL it mid-episode, restart it with the same checkpoint directory."""
    ALL_SHARDS_DOWN = "all_shards_down"
    """SIGKILL every shard; restart them all after the hold."""
    SHARD_TERMINATE = "shard_terminate"
    """SIGTERM a shard (a graceful stop, as a Deployment update sends: it stops listening and finishes what it has in
    flight); start it again on the same port after the hold. On :data:`FLEET_TARGET`: a rolling restart, every shard
    in turn, each one healthy again before the next is stopped (``maxUnavailable: 1`` behind a readiness probe)."""
    GRAY_200 = "gray_200"
    """A gray shard: ``/health`` stays 200 while generation answers 200 with a body that is not a completion
    (``body``), at ``rate`` (every request when None) or for the next ``count`` requests, for the hold."""
    CONCURRENCY_CAP = "concurrency_cap"
    """A shard serves at most ``count`` generation requests at once for the hold; one more is answered 429 with
    ``Retry-After: 1`` at once."""


GENERATED_KINDS: Final[tuple[FaultKind, ...]] = tuple(
    kind for kind in FaultKind if kind not in (FaultKind.SHARD_TERMINATE, FaultKind.GRAY_200, FaultKind.CONCURRENCY_CAP)
)
"""The kinds :meth:`FaultSchedule.generate` draws by default (the chaos suite's and the demo's mix); the later kinds
are placed by hand, in bench/failover_scenarios.py's scenarios."""


_SHARD_KINDS: Final[frozenset[FaultKind]] = frozenset(
    {
        FaultKind.SHARD_KILL,
        FaultKind.SHARD_HANG,
        FaultKind.SHARD_SLOW,
        FaultKind.ERROR_BURST_5XX,
        FaultKind.RATE_LIMIT_429,
        FaultKind.CONNECTION_DROP,
        FaultKind.WRONG_MODEL,
        FaultKind.SHARD_TERMINATE,
        FaultKind.GRAY_200,
        FaultKind.CONCURRENCY_CAP,
    }
)
_5XX: Final[tuple[int, ...]] = (500, 502, 503, 504)


class Fault(BaseModel):
    """One fault: what, on which target, when (fraction of prompts finished, or seconds) and for how long."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FaultKind
    target: str
    """A shard name, :data:`FLEET_TARGET` for every shard, or an environment target's name."""
    at_progress: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Start once this fraction of the run's prompts has finished."""
    at_seconds: Annotated[float, Field(ge=0, le=3600)] | None = None
    """Start this long after :meth:`FaultInjector.start_clock` instead (a wall-clock timeline; ``at_progress`` 0)."""
    hold_seconds: Annotated[float, Field(ge=0, le=3600)] = 0.0
    """How long the fault lasts; a burst ends after ``count`` requests or this long, whichever comes first."""
    until_progress: Annotated[float, Field(ge=0, le=1)] | None = None
    """End once this fraction of the prompts has finished instead of after ``hold_seconds`` (at the latest when the
    injector closes)."""
    count: Annotated[int, Field(ge=0)] = 0
    """Requests hit by a burst (5xx, 429, dropped connections); 0 hits every request for the hold."""
    status: Annotated[int, Field(ge=400, le=599)] | None = None
    """The HTTP status of an error burst."""
    slow_seconds: Annotated[float, Field(ge=0, le=60)] = 0.0
    flap_seconds: Annotated[float, Field(gt=0, le=3600)] | None = None
    """For ERROR_BURST_5XX: the shard flaps for the hold (see :attr:`SimFaults.flap_seconds`)."""
    rate: Annotated[float, Field(gt=0, le=1)] | None = None
    """For GRAY_200: the fraction of generation requests answered with ``body`` (every one when None)."""
    body: Literal["truncated", "no_choices", "error_object", "empty"] = "error_object"
    """For GRAY_200: what the 200 carries (see :attr:`SimFaults.not_a_completion`)."""

    @model_validator(mode="after")
    def _one_trigger(self) -> Fault:
        if self.at_seconds is not None and self.at_progress:
            raise ValueError("a fault starts at_progress or at_seconds, not both")
        if self.until_progress is not None and self.until_progress < self.at_progress:
            raise ValueError("until_progress must not be before at_progress")
        if self.flap_seconds is not None and self.kind is not FaultKind.ERROR_BURST_5XX:
            raise ValueError("flap_seconds applies to error_burst_5xx only")
        if self.rate is not None and self.kind is not FaultKind.GRAY_200:
            raise ValueError("rate applies to gray_200 only")
        if self.kind is FaultKind.CONCURRENCY_CAP and self.count < 1:
            raise ValueError("concurrency_cap needs count >= 1 (the requests served at once)")
        return self

    def active(self, seconds: float) -> bool:
        """Whether a timed fault holds at ``seconds`` on its schedule's clock (a progress fault never does)."""
        return self.at_seconds is not None and self.at_seconds <= seconds < self.at_seconds + self.hold_seconds

    def describe(self) -> str:
        until, hold = self.until_progress, self.hold_seconds
        lasting = f"for {hold:g}s" if until is None else f"until {until:.0%}"
        after = f"after {hold:g}s" if until is None else f"at {until:.0%}"
        bound = f"(<= {hold:g}s)" if until is None else f"(until {until:.0%})"
        status = "HTTP 429" if self.kind is FaultKind.RATE_LIMIT_429 else str(self.status or 503)
        if self.flap_seconds is not None:
            flap = self.flap_seconds
            what = f"flaps, /health and generation answer 503 {flap:g}s of every {2 * flap:g}s, {lasting}"
        elif self.kind is FaultKind.CONNECTION_DROP:
            what = (
                f"next {self.count} responses cut off mid-body {bound}"
                if self.count
                else f"every response cut off mid-body {lasting}"
            )
        elif self.kind is FaultKind.GRAY_200:
            share = "every" if self.rate is None else f"{self.rate:.0%} of"
            what = (
                f"next {self.count} answers are 200 with body {self.body!r} {bound}"
                if self.count
                else f"{share} answers 200 with body {self.body!r} {lasting}"
            )
        elif self.kind in _BURST_KINDS:
            what = (
                f"next {self.count} requests answer {status} {bound}"
                if self.count
                else f"every request answers {status} {lasting}"
            )
        else:
            what = {
                FaultKind.SHARD_KILL: f"SIGKILL, restart {after}",
                FaultKind.SHARD_HANG: f"SIGSTOP {lasting}, then SIGCONT",
                FaultKind.SHARD_SLOW: f"+{self.slow_seconds:g}s per request {lasting}",
                FaultKind.WRONG_MODEL: f"serves another model {lasting}",
                FaultKind.ENV_CRASH: "checkpoint, SIGKILL mid-episode, restart from the checkpoint directory",
                FaultKind.ALL_SHARDS_DOWN: f"SIGKILL every shard, restart all {after}",
                FaultKind.SHARD_TERMINATE: (
                    f"SIGTERM (graceful), start again {after}"
                    if self.target != FLEET_TARGET
                    else f"rolling restart: SIGTERM each shard in turn, start it again {after}, healthy before the next"
                ),
                FaultKind.CONCURRENCY_CAP: f"at most {self.count} requests at once, 429 beyond, {lasting}",
            }[self.kind]
        at = f"{self.at_progress:.0%}" if self.at_seconds is None else f"{self.at_seconds:g}s"
        return f"{self.kind.value} on {self.target} at {at}: {what}"


class FaultSchedule(BaseModel):
    """The faults of one scenario, sorted by when they start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int | None = None
    faults: tuple[Fault, ...] = ()

    def kinds(self) -> Counter[str]:
        return Counter(f.kind.value for f in self.faults)

    @classmethod
    def of(cls, faults: Sequence[Fault], seed: int | None = None) -> FaultSchedule:
        return cls(seed=seed, faults=tuple(sorted(faults, key=lambda f: (f.at_progress, f.at_seconds or 0.0))))

    def active(self, target: str, seconds: float) -> list[Fault]:
        """The timed faults on ``target`` that hold at ``seconds`` on the schedule's clock."""
        return [fault for fault in self.faults if fault.target == target and fault.active(seconds)]

    @classmethod
    def generate(
        cls,
        seed: int,
        shards: Sequence[str],
        *,
        kinds: Sequence[FaultKind] = GENERATED_KINDS,
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


class ShardFleet(Protocol):
    """The shards the injector acts on, by name: processes it can kill, freeze and restart, and (for the sim shard)
    faults it can set in their answers."""

    model: str

    @property
    def names(self) -> list[str]: ...

    def alive(self, name: str) -> bool: ...

    async def kill(self, name: str) -> int | None:
        """SIGKILL the shard; return its exit status when known."""
        ...

    def hang(self, name: str) -> None:
        """Freeze the shard (SIGSTOP): it still accepts connections, nothing answers."""
        ...

    def resume(self, name: str) -> None: ...

    async def restart(self, name: str) -> Shard:
        """Start it again on the same endpoint and wait until it answers its health check."""
        ...

    async def set_faults(self, name: str, **fields: Any) -> Any:
        """Make its answers faulty (the sim shard's fault fields); a shard that cannot raises."""
        ...


@runtime_checkable
class GracefulFleet(Protocol):
    """A fleet that can stop a shard gracefully, for SHARD_TERMINATE (SimFleet can; a fleet without it refuses that
    fault when it comes, as an error of the injector, never of the run)."""

    async def terminate(self, name: str) -> tuple[int | None, dict[str, int]]:
        """SIGTERM the shard and wait for it to exit; its exit status and its counters after the drain."""
        ...


class EnvironmentTarget(Protocol):
    """An environment server the injector can crash mid-episode and bring back."""

    async def checkpoint(self) -> list[str]:
        """Open a checkpoint; return the episode ids it exported (episodes stay parked)."""
        ...

    async def resume(self) -> None:
        """Release the open checkpoint's parked episodes (none are lost)."""
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

    async def resume(self) -> None:
        from rollout_runtime.environment import EnvironmentClient

        async with EnvironmentClient(self.url, timeout_seconds=30.0) as client:
            await client.resume_checkpoint()

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
    lifted: float | None = None
    """When the hold ended and the undo (restart, SIGCONT, clearing) began; ``ended`` is once the undo is done."""
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
    returns at once; faults timed in seconds start on their own once :meth:`start_clock` was called. :meth:`close`
    cancels faults not yet finished and undoes what they did (resumes hung shards, restarts killed ones, clears
    runtime faults), so nothing is left broken behind a run. ``observer`` sees each fault when it is in effect and
    again when it has ended; ``before_apply`` runs right before a fault is applied (e.g. to read a shard's counters
    before it is killed).
    """

    def __init__(
        self,
        fleet: ShardFleet,
        schedule: FaultSchedule,
        *,
        environments: Mapping[str, EnvironmentTarget] | None = None,
        observer: Callable[[InjectedFault], None] | None = None,
        before_apply: Callable[[Fault], Awaitable[None]] | None = None,
    ) -> None:
        self.fleet = fleet
        self.schedule = schedule
        self.environments = dict(environments or {})
        self.injected: list[InjectedFault] = []
        self.errors: list[str] = []
        self._observer = observer
        self._before_apply = before_apply
        self._pending = [fault for fault in schedule.faults if fault.at_seconds is None]
        self._timed = sorted((f for f in schedule.faults if f.at_seconds is not None), key=lambda f: f.at_seconds or 0)
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.Task[None]] = set()
        self._undoing: set[asyncio.Future[Any]] = set()
        """Undo steps still running after their fault was cancelled (a restart outlives the cancel: shielded)."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._applied = 0
        self._applied_changed = asyncio.Event()
        self._progress = 0.0
        self._progressed = asyncio.Event()
        for fault in schedule.faults:
            if fault.kind is FaultKind.ENV_CRASH and fault.target not in self.environments:
                raise ValueError(f"{fault.describe()}: no environment target named {fault.target!r}")
            rolling = fault.kind is FaultKind.SHARD_TERMINATE and fault.target == FLEET_TARGET
            if fault.kind in _SHARD_KINDS and fault.target not in fleet.names and not rolling:
                raise ValueError(f"{fault.describe()}: no shard named {fault.target!r}")

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._timed)

    @property
    def active(self) -> int:
        return sum(1 for task in self._tasks if not task.done())

    def advance(self, progress: float) -> None:
        """Start every pending fault whose ``at_progress`` is at most ``progress``; end those held until it."""
        self._progress = max(self._progress, progress)
        self._progressed.set()
        while self._pending and self._pending[0].at_progress <= progress:
            self._start(self._pending.pop(0))

    def start_clock(self) -> float:
        """Start the clock of the faults timed in seconds (each starts ``at_seconds`` later); return its loop time."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for fault in self._timed:
            timer = asyncio.create_task(self._start_at(t0 + (fault.at_seconds or 0.0), fault), name="chaos-clock")
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)
        return t0

    async def _start_at(self, when: float, fault: Fault) -> None:
        await asyncio.sleep(max(0.0, when - asyncio.get_running_loop().time()))  # the timeline is the clock
        self._timed.remove(fault)
        self._start(fault)

    def _start(self, fault: Fault) -> None:
        task = asyncio.create_task(self._run(fault), name=f"chaos-{fault.kind.value}-{fault.target}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def until_applied(self, count: int) -> None:
        """Wait until ``count`` faults are in effect (or were: a fault that could not be applied counts too)."""
        while self._applied < count:
            self._applied_changed.clear()
            await self._applied_changed.wait()

    async def wait(self) -> None:
        """Wait for every started fault (and, once the clock runs, every timed one) to end and be undone, including
        the undo steps of cancelled faults (a killed shard's restart), so that nothing is left half-broken."""
        while self._tasks or self._timers or self._undoing:
            await asyncio.gather(*self._timers, *self._tasks, *self._undoing, return_exceptions=True)

    async def close(self) -> None:
        """Drop faults not started; cancel running ones (each undoes itself); wait for them."""
        self._pending.clear()
        self._timed.clear()
        for task in [*self._timers, *self._tasks]:
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
                if self._before_apply is not None:
                    await self._before_apply(fault)
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
                if self._observer is not None:
                    self._observer(record)

    def _mark_applied(self, record: InjectedFault) -> None:
        if not record.applied.is_set():
            record.applied.set()
            self._applied += 1
            self._applied_changed.set()
            if self._observer is not None and record.ended is None:
                self._observer(record)

    async def _apply(self, fault: Fault, record: InjectedFault) -> None:
        fleet, name, kind = self.fleet, fault.target, fault.kind
        if kind is FaultKind.SHARD_KILL:
            record.detail["exit_status"] = await fleet.kill(name)
            await self._hold_then(record, self._restart(name))
        elif kind is FaultKind.SHARD_HANG:
            fleet.hang(name)
            self._mark_applied(record)
            try:
                await self._hold(fault)
            finally:
                record.lifted = asyncio.get_running_loop().time()
                fleet.resume(name)
        elif kind is FaultKind.SHARD_SLOW:
            await fleet.set_faults(name, slow_seconds=fault.slow_seconds)
            await self._hold_then(record, self._clear(name, slow_seconds=0.0))
        elif fault.flap_seconds is not None:
            await fleet.set_faults(name, flap_seconds=fault.flap_seconds)
            await self._hold_then(record, self._clear(name, flap_seconds=None))
        elif kind is FaultKind.CONNECTION_DROP:
            drop: dict[str, Any] = {"drop_next": fault.count} if fault.count else {"drop_rate": 1.0}
            await fleet.set_faults(name, **drop)
            await self._hold_then(record, self._clear(name, **dict.fromkeys(drop, 0)))
        elif kind in _BURST_KINDS:
            status = 429 if kind is FaultKind.RATE_LIMIT_429 else (fault.status or 503)
            burst: dict[str, Any] = {"fail_next": fault.count} if fault.count else {"error_rate": 1.0}
            await fleet.set_faults(name, error_status=status, **burst)
            await self._hold_then(record, self._clear(name, **dict.fromkeys(burst, 0)))
        elif kind is FaultKind.SHARD_TERMINATE and name == FLEET_TARGET:
            graceful = self._graceful()
            record.detail["final_stats"] = []
            self._mark_applied(record)
            for shard in fleet.names:
                try:
                    code, drained = await graceful.terminate(shard)
                    record.detail["final_stats"].append(drained)
                    record.detail.setdefault("exit_status", []).append(code)
                    await self._hold(fault)
                finally:
                    await self._undo(self._restart(shard))  # back (and healthy) before the next one stops
            record.lifted = asyncio.get_running_loop().time()
        elif kind is FaultKind.SHARD_TERMINATE:
            exit_status, counters = await self._graceful().terminate(name)
            record.detail["exit_status"], record.detail["final_stats"] = exit_status, [counters]
            await self._hold_then(record, self._restart(name))
        elif kind is FaultKind.GRAY_200:
            gray: dict[str, Any] = (
                {"not_a_completion_next": fault.count} if fault.count else {"not_a_completion_rate": fault.rate or 1.0}
            )
            await fleet.set_faults(name, not_a_completion=fault.body, **gray)
            await self._hold_then(record, self._clear(name, **dict.fromkeys(gray, 0)))
        elif kind is FaultKind.CONCURRENCY_CAP:
            await fleet.set_faults(name, max_concurrent=fault.count, busy_retry_after_seconds=1)
            await self._hold_then(record, self._clear(name, max_concurrent=None))
        elif kind is FaultKind.WRONG_MODEL:
            await fleet.set_faults(name, wrong_model=f"{fleet.model}-imposter")
            await self._hold_then(record, self._clear(name, wrong_model=None))
        elif kind is FaultKind.ENV_CRASH:
            environment = self.environments[name]
            record.detail["checkpointed_episodes"] = await self._checkpoint_mid_episode(environment)
            await environment.crash()
            await environment.restart()
        elif kind is FaultKind.ALL_SHARDS_DOWN:
            names = [n for n in fleet.names if fleet.alive(n)]
            await asyncio.gather(*(fleet.kill(n) for n in names))
            record.detail["killed"] = names
            await self._hold_then(record, self._restart_all(names))
        else:  # pragma: no cover - the enum is closed
            raise AssertionError(kind)

    def _graceful(self) -> GracefulFleet:
        if not isinstance(self.fleet, GracefulFleet):
            raise TypeError(f"{type(self.fleet).__name__} cannot stop a shard gracefully (shard_terminate)")
        return self.fleet

    async def _checkpoint_mid_episode(self, environment: EnvironmentTarget) -> list[str]:
        """Checkpoint once an episode is in flight, so the crash tests resuming and not an idle server.

        A checkpoint that caught nothing (every episode between steps or not yet begun, say while the shards are
        down) is released, and tried again each time the run makes progress, until the run ends.
        """
        while True:
            episodes = await environment.checkpoint()
            if episodes or self._progress >= 1.0:
                return episodes
            await environment.resume()
            self._progressed.clear()
            await self._progressed.wait()

    async def _hold(self, fault: Fault) -> None:
        """Wait out the fault: ``hold_seconds``, or until the run's progress reaches ``until_progress``."""
        if fault.until_progress is None:
            await asyncio.sleep(fault.hold_seconds)
            return
        while self._progress < fault.until_progress:
            self._progressed.clear()
            await self._progressed.wait()

    async def _hold_then(self, record: InjectedFault, undo: Any) -> None:
        """Hold the fault, then undo it; undo also when cancelled (a run that ends leaves nothing broken)."""
        self._mark_applied(record)
        try:
            await self._hold(record.fault)
        finally:
            record.lifted = asyncio.get_running_loop().time()
            await self._undo(undo)

    async def _undo(self, undo: Awaitable[Any]) -> None:
        """Run an undo step to its end even if this fault is cancelled meanwhile; :meth:`wait` waits for it."""
        step = asyncio.ensure_future(undo)
        self._undoing.add(step)
        step.add_done_callback(self._undoing.discard)
        await asyncio.shield(step)

    async def _restart(self, name: str) -> None:
        await self.fleet.restart(name)

    async def _restart_all(self, names: Sequence[str]) -> None:
        await asyncio.gather(*(self.fleet.restart(n) for n in names))

    async def _clear(self, name: str, **fields: Any) -> None:
        if self.fleet.alive(name):
            await self.fleet.set_faults(name, **fields)
