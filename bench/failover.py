"""Benchmark 1: failover goodput against real load balancers, measured side by side in one run.

Every contender gets a fresh fleet of simulated shards (real subprocesses, same seed), the same prompts and the
same chaos schedule on the wall clock from its first request: one shard SIGKILLed (restarted later), one SIGSTOPped
(hung: the kernel still accepts connections, nothing answers; resumed later), one flapping (``/health`` and
generation answer 503 half the time), and seeded bursts of 503s on the others. Contenders:

- rollout-fleet: the Dispatcher with active probes (LocalShardSource) and passive ejection;
- HAProxy (Debian package): active ``option httpchk``, ``observe layer7`` + ``on-error mark-down``, ``retries`` with
  ``option redispatch 1`` and L7 ``retry-on`` (bench/_peers.py has the exact config), a naive client in front;
- nginx (Debian package): ``max_fails``/``fail_timeout``, ``proxy_next_upstream ... non_idempotent`` (nginx never
  retries a POST without it), a naive client in front;
- router: ``rollout-fleet router`` (the same dispatcher behind an OpenAI-compatible endpoint), with the proxies'
  naive client in front (each prompt sent once);
- naive: each prompt bound to one shard, retried there with the same budget and backoff as the dispatcher.

Probe period/timeout/thresholds, per-attempt timeout and the attempt budget are the same for every contender that
has the knob. Reported per contender: prompts completed (correct answer), lost or wrongly failed (no valid prompt
should fail), generation requests that reached a shard and how many were wasted (did not produce the answer),
p50/p99/max prompt latency (first send to final outcome, over all prompts), seconds from the kill (and from the hang) to
the last request sent to that shard while it was down, and wall time; then each peer's ratios to rollout-fleet.

    python bench/failover.py                    # full run: 6 shards, 32 concurrent, 4800 prompts (~4 minutes)
    python bench/failover.py --smoke            # tiny sizes (CI; no numbers asserted)
    python bench/failover.py --contenders rollout-fleet,haproxy --seed 7
    python bench/failover.py --seeds 1,2,3,4     # one run per seed, then each contender's medians over them
    python bench/failover.py --scenario poison      # a poison prompt among 4,800: healthy shards ejected, run ends?
    python bench/failover.py --scenario fleet-401   # every shard 401: attempts to the run-level error vs a naive loop
    python bench/failover.py --scenario no-shards   # 100,000 prompts, zero healthy shards: time to error, peak RSS

Needs the peers: ``bash scripts/install-tools.sh haproxy nginx``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from prometheus_client import CollectorRegistry

from _peers import HAProxy, Nginx, ProxySettings, SendLog
from rollout_runtime.dispatch import (
    AttemptEnded,
    Completed,
    Dispatcher,
    DispatchEvent,
    DispatchPolicy,
    HealthyShardsChanged,
    ShardEjected,
    ShardRestored,
    backoff_seconds,
)
from rollout_runtime.failures import FailureClass, RolloutFailure, classify_rollout_failure
from rollout_runtime.generation import GenerationClient, GenerationOptions
from rollout_runtime.health import ProbeSettings
from rollout_runtime.router import Router, RouterConfig, serve_router
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim import SimFleet, expected_answer
from rollout_runtime.sim.chaos import Fault, FaultInjector, FaultKind, FaultSchedule

MARKER = "failover ratios vs rollout-fleet"
CONTENDERS = (
    "rollout-fleet",
    "rollout-fleet-streaming",
    "rollout-fleet-hedged",
    "haproxy",
    "nginx",
    "router",
    "naive",
)
KILLED, HUNG, FLAPPING = "shard-1", "shard-2", "shard-3"


@dataclass(frozen=True)
class Scale:
    shards: int
    concurrency: int
    duration: float
    """Length of the chaos timeline; the prompt count makes an undisturbed run last about this long."""
    latency: float
    """Simulated generation time per request (the sims' ``slow_seconds``)."""
    attempt_timeout: float
    probe_period: float
    probe_timeout: float
    backoff_initial: float
    backoff_max: float
    tries: int = 5
    fall: int = 2
    rise: int = 2

    @property
    def prompts(self) -> int:
        return int(self.duration * self.concurrency / self.latency)

    def probe(self) -> ProbeSettings:
        return ProbeSettings(
            period_seconds=self.probe_period,
            timeout_seconds=self.probe_timeout,
            failure_threshold=self.fall,
            success_threshold=self.rise,
            check_model=True,
        )

    def policy(self) -> DispatchPolicy:
        return DispatchPolicy(
            max_infra_attempts=self.tries,
            backoff_initial_seconds=self.backoff_initial,
            backoff_max_seconds=self.backoff_max,
            max_concurrency=self.concurrency,
            attempt_timeout_seconds=self.attempt_timeout,
            healthy_wait_seconds=self.duration,
            # Count a prompt that runs out of budget as lost; never end the run.
            max_skipped_prompts=self.prompts,
            max_consecutive_dropped_prompts=self.prompts,
            min_step_batch_fraction=0.01,
        )

    def proxy(self) -> ProxySettings:
        return ProxySettings(
            attempt_timeout=self.attempt_timeout,
            probe_period=self.probe_period,
            probe_timeout=self.probe_timeout,
            fall=self.fall,
            rise=self.rise,
            tries=self.tries,
            fail_timeout=max(1.0, 10 * self.probe_period),
        )


FULL = Scale(6, 32, 30.0, 0.2, 10.0, 0.5, 0.25, 0.1, 2.0)
SMOKE = Scale(5, 8, 3.0, 0.05, 1.5, 0.25, 0.15, 0.05, 0.5)


# -- the chaos schedule ---------------------------------------------------------------------------------------


def chaos_schedule(scale: Scale, seed: int) -> FaultSchedule:
    """The seeded timeline every contender faces: kill/restart, hang/resume, flapping, and 503 bursts.

    A burst is a span of time in which a shard answers every generation request with 503 while its ``/health``
    stays 200 (an overloaded or wedged engine), not a count of failures: a count would reward whoever sends the
    sick shard the fewest requests while the count lasts, and a real sick spell does not end by being hit.
    """
    d = scale.duration
    flap = max(0.05 * d, 3 * scale.probe_period)
    faults = [
        Fault(kind=FaultKind.ERROR_BURST_5XX, target=FLAPPING, at_seconds=0.10 * d, hold_seconds=0.70 * d,
              flap_seconds=flap, status=503),
        Fault(kind=FaultKind.SHARD_KILL, target=KILLED, at_seconds=0.15 * d, hold_seconds=0.40 * d),
        Fault(kind=FaultKind.SHARD_HANG, target=HUNG, at_seconds=0.30 * d, hold_seconds=0.40 * d),
    ]  # fmt: skip
    rng = random.Random(seed)
    burstable = [f"shard-{i}" for i in range(scale.shards) if f"shard-{i}" not in (KILLED, HUNG, FLAPPING)]
    for _ in range(max(3, int(d / 2))):
        at, shard = round(rng.uniform(0.05 * d, 0.85 * d), 3), rng.choice(burstable)
        hold = round(rng.uniform(0.02 * d, 0.06 * d), 3)
        faults.append(Fault(kind=FaultKind.ERROR_BURST_5XX, target=shard, at_seconds=at, hold_seconds=hold, status=503))
    return FaultSchedule.of(faults, seed=seed)


def fault_window(injector: FaultInjector, kind: FaultKind) -> tuple[float | None, float | None]:
    """When the first fault of ``kind`` started and when its undo began (loop time, which is time.monotonic())."""
    record = next((r for r in injector.injected if r.fault.kind is kind), None)
    return (None, None) if record is None else (record.started, record.lifted)


# -- what every contender records -----------------------------------------------------------------------------

Prompt = tuple[int, str]


def make_prompts(count: int, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    ops = "+-*"
    return [(i, f"What is {rng.randint(2, 999)} {rng.choice(ops)} {rng.randint(2, 999)}?") for i in range(count)]


@dataclass
class Tally:
    started: dict[int, float] = field(default_factory=dict)
    ended: dict[int, float] = field(default_factory=dict)
    completed: int = 0
    failed: dict[int, str] = field(default_factory=dict)
    wrong: int = 0
    sends: SendLog = field(default_factory=SendLog)
    detail: str = ""
    trace: dict[int, list[tuple[float, str]]] = field(default_factory=dict)
    """Prompt -> (send time, shard) of each attempt, where the contender itself picks the shard."""
    events: list[tuple[float, str]] = field(default_factory=list)
    """What the contender's health view did and when (the dispatcher's healthy-set changes and ejections)."""

    def send(self, prompt_id: int, shard: str) -> None:
        now = self.start(prompt_id)
        self.sends.add(shard, now)
        self.trace.setdefault(prompt_id, []).append((now, shard))

    def start(self, prompt_id: int) -> float:
        now = time.monotonic()
        self.started.setdefault(prompt_id, now)
        return now

    def finish(self, prompt_id: int, text: str | None, prompt: str, error: str | None = None) -> None:
        self.ended[prompt_id] = time.monotonic()
        self.started.setdefault(prompt_id, self.ended[prompt_id])
        if error is not None:
            self.failed[prompt_id] = error
        elif text is not None and text.strip() == expected_answer(prompt):
            self.completed += 1
        else:
            self.wrong += 1


Begin = Callable[[], float]
"""Called by a contender right before its first request: starts the chaos clock, returns t0."""


async def drive_rollout_fleet(
    fleet: SimFleet,
    prompts: list[Prompt],
    scale: Scale,
    seed: int,
    tally: Tally,
    begin: Begin,
    *,
    policy: DispatchPolicy | None = None,
    options: GenerationOptions | None = None,
) -> None:
    all_up = asyncio.Event()

    def observe(event: DispatchEvent) -> None:
        if isinstance(event, HealthyShardsChanged):
            if len(event.routable) == scale.shards:
                all_up.set()
            tally.events.append((time.monotonic(), f"routable {','.join(n[-1] for n in event.routable)}"))
        elif isinstance(event, ShardEjected | ShardRestored):
            tally.events.append((time.monotonic(), f"{type(event).__name__} {event.shard}"))

    source = LocalShardSource(fleet.shards, scale.probe())
    client = GenerationClient(timeout_seconds=scale.attempt_timeout + 1.0, connect_timeout_seconds=1.0)
    policy = policy or scale.policy()
    dispatcher = Dispatcher(source, policy, observer=observe, seed=seed, registry=CollectorRegistry())
    async with client, dispatcher:
        await asyncio.wait_for(all_up.wait(), 30.0)

        async def rollout(shard: Shard, prompt: Prompt) -> str:
            tally.send(prompt[0], shard.name)
            return (await client.complete(shard, prompt[1], max_tokens=16, options=options)).text

        texts = {pid: text for pid, text in prompts}
        run = dispatcher.run(prompts, rollout, prompt_ids=[pid for pid, _ in prompts])
        begin()
        async for outcome in run:
            pid = int(outcome.prompt_id)
            if isinstance(outcome, Completed):
                tally.finish(pid, outcome.result, texts[pid])
            else:
                tally.finish(pid, None, texts[pid], error=f"{type(outcome).__name__}: {outcome.reason}")
        st = run.stats
        tally.detail = (
            f"dispatcher attempts: {st.successes} ok, {st.infra_failures} infra-failed, {st.data_failures} "
            f"data-failed, {st.cancelled} evicted or hedge losers; {st.ejections} ejections, {st.skipped} skipped; "
            f"{st.hedges} hedges, {st.hedges_wasted} wasted"
        )


async def drive_rollout_fleet_streaming(
    fleet: SimFleet, prompts: list[Prompt], scale: Scale, seed: int, tally: Tally, begin: Begin
) -> None:
    """rollout-fleet with streamed requests and the progress watchdog: a frozen shard is left by its silence."""
    policy = scale.policy().model_copy(
        update={"progress_watchdog": True, "progress_factor": 3.0, "progress_floor_seconds": 0.3}
    )
    options = GenerationOptions(stream=True)
    await drive_rollout_fleet(fleet, prompts, scale, seed, tally, begin, policy=policy, options=options)


async def drive_rollout_fleet_hedged(
    fleet: SimFleet, prompts: list[Prompt], scale: Scale, seed: int, tally: Tally, begin: Begin
) -> None:
    """rollout-fleet with hedging: an attempt still running after its shard's p99 latency x 2 is hedged elsewhere."""
    policy = scale.policy().model_copy(update={"hedge_factor": 2.0})
    await drive_rollout_fleet(fleet, prompts, scale, seed, tally, begin, policy=policy)


async def _workers(prompts: list[Prompt], concurrency: int, one: Callable[[Prompt], Awaitable[None]]) -> None:
    queue: asyncio.Queue[Prompt] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)

    async def work() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    await asyncio.gather(*(work() for _ in range(concurrency)))


async def drive_through_proxy(url: str, prompts: list[Prompt], scale: Scale, tally: Tally, begin: Begin) -> None:
    """The naive client: one request per prompt to the proxy, whose own retries are all the failover there is."""
    proxy = Shard(name="proxy", endpoint=url, model="sim-model")
    # Long enough that the proxy's own retries (tries x attempt timeout) finish before the client gives up.
    timeout = scale.tries * scale.attempt_timeout + 5.0
    async with GenerationClient(timeout_seconds=timeout, connect_timeout_seconds=1.0) as client:

        async def one(prompt: Prompt) -> None:
            pid, text = prompt
            tally.start(pid)
            try:
                answer = await client.complete(proxy, text, max_tokens=16)
            except RolloutFailure as exc:
                tally.finish(pid, None, text, error=f"{type(exc).__name__}: {exc}")
            else:
                tally.finish(pid, answer.text, text)

        begin()
        await _workers(prompts, scale.concurrency, one)


async def drive_router(fleet: SimFleet, prompts: list[Prompt], scale: Scale, tally: Tally, begin: Begin) -> None:
    """``rollout-fleet router`` in front of the fleet, the proxies' naive client in front of it; sends are the
    dispatcher's attempts (each one's start: its end minus its duration)."""

    all_up = asyncio.Event()

    def observe(event: DispatchEvent) -> None:
        if isinstance(event, HealthyShardsChanged) and len(event.routable) == scale.shards:
            all_up.set()
        elif isinstance(event, AttemptEnded) and event.shard is not None:
            tally.sends.add(event.shard, time.monotonic() - event.seconds)
        elif isinstance(event, ShardEjected | ShardRestored):
            tally.events.append((time.monotonic(), f"{type(event).__name__} {event.shard}"))

    config = RouterConfig(
        read_timeout_seconds=scale.attempt_timeout,
        connect_timeout_seconds=1.0,
        max_attempts=scale.tries,
        healthy_wait_seconds=scale.duration,
    )
    source = LocalShardSource(fleet.shards, scale.probe())
    async with Router(source, config, observer=observe) as router, serve_router(router) as server:
        await asyncio.wait_for(all_up.wait(), 30.0)
        await drive_through_proxy(server.url, prompts, scale, tally, begin)
        st = router.dispatcher.metrics
        tally.detail = f"router ejections {sum(st.ejections.values())}, redispatches {st.redispatches}"


async def drive_naive(
    fleet: SimFleet, prompts: list[Prompt], scale: Scale, seed: int, tally: Tally, begin: Begin
) -> None:
    """Each prompt bound to shard ``id % N``; infra failures retried there with the dispatcher's budget and backoff."""
    shards = fleet.shards
    policy = scale.policy()
    rng = random.Random(seed)
    async with GenerationClient(timeout_seconds=scale.attempt_timeout, connect_timeout_seconds=1.0) as client:

        async def one(prompt: Prompt) -> None:
            pid, text = prompt
            shard = shards[pid % len(shards)]
            error = "never tried"
            for attempt in range(1, scale.tries + 1):
                tally.send(pid, shard.name)
                try:
                    answer = await client.complete(shard, text, max_tokens=16)
                except RolloutFailure as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    if classify_rollout_failure(exc) is FailureClass.DATA:
                        break
                    if attempt < scale.tries:
                        await asyncio.sleep(backoff_seconds(policy, attempt, rng.random()))
                else:
                    tally.finish(pid, answer.text, text)
                    return
            tally.finish(pid, None, text, error=error)

        begin()
        await _workers(prompts, scale.concurrency, one)


# -- one contender end to end ---------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    completed: int
    lost: int
    wrong: int
    shard_requests: int
    wasted: int
    p50: float
    p99: float
    worst: float
    kill_to_last: float | None
    hang_to_last: float | None
    wall: float
    detail: str = ""
    late: int = 0
    """Prompts that took more than 1 s longer than an undisturbed generation."""


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def print_trace(name: str, tally: Tally, t0: float, injector: FaultInjector, count: int) -> None:
    """The slowest prompts with each attempt's send time and shard (where the contender picks shards)."""
    marks = [
        f"{r.fault.kind.value} {r.fault.target} {r.started - t0:.2f}s..{(r.lifted or r.started) - t0:.2f}s"
        for r in injector.injected
    ]
    print(f"  trace {name}: chaos at {'; '.join(marks)}")
    changes = [f"{at - t0:.2f}s {what}" for at, what in tally.events if at >= t0]
    if changes:
        print(f"    health view: {'; '.join(changes)}")
    slowest = sorted(tally.ended, key=lambda pid: tally.ended[pid] - tally.started[pid], reverse=True)[:count]
    for pid in slowest:
        tries = ", ".join(f"{at - t0:.2f}s {shard}" for at, shard in tally.trace.get(pid, []))
        took = tally.ended[pid] - tally.started[pid]
        print(
            f"    prompt {pid}: {took:.2f}s, ended {tally.ended[pid] - t0:.2f}s [{tries}] {tally.failed.get(pid, '')}"
        )


async def run_contender(name: str, scale: Scale, seed: int, trace: int = 0) -> Row:
    prompts = make_prompts(scale.prompts, seed)
    tally = Tally()
    t0 = 0.0
    requests_before_kill = 0
    async with SimFleet(scale.shards, seed=seed, extra_args=("--slow", str(scale.latency))) as fleet:

        async def count_before_kill(fault: Fault) -> None:
            """A restarted sim shard counts from zero: keep what the killed one had served."""
            nonlocal requests_before_kill
            if fault.kind is FaultKind.SHARD_KILL:
                requests_before_kill = (await fleet.stats(fault.target)).get("generation_requests", 0)

        chaos = FaultInjector(fleet, chaos_schedule(scale, seed), before_apply=count_before_kill)

        def begin() -> float:
            nonlocal t0
            t0 = chaos.start_clock()
            return t0

        ports = {shard.name: int(shard.endpoint.rsplit(":", 1)[1]) for shard in fleet.shards}
        try:
            if name == "rollout-fleet":
                await drive_rollout_fleet(fleet, prompts, scale, seed, tally, begin)
            elif name == "rollout-fleet-streaming":
                await drive_rollout_fleet_streaming(fleet, prompts, scale, seed, tally, begin)
            elif name == "rollout-fleet-hedged":
                await drive_rollout_fleet_hedged(fleet, prompts, scale, seed, tally, begin)
            elif name == "router":
                await drive_router(fleet, prompts, scale, tally, begin)
            elif name == "naive":
                await drive_naive(fleet, prompts, scale, seed, tally, begin)
            elif name == "haproxy":
                async with HAProxy(ports, scale.proxy()) as haproxy:
                    await haproxy.wait_all_up()
                    haproxy.start_polling()
                    await drive_through_proxy(haproxy.url, prompts, scale, tally, begin)
                    await haproxy.stop_polling()
                    tally.sends = haproxy.sends
                    retries = sum(c["wretr"] for c in haproxy.counters.values())
                    redispatches = sum(c["wredis"] for c in haproxy.counters.values())
                    tally.detail = f"haproxy retries {retries}, redispatches {redispatches}"
            elif name == "nginx":
                offset = time.time() - time.monotonic()
                async with Nginx(ports, scale.proxy()) as nginx:
                    await drive_through_proxy(nginx.url, prompts, scale, tally, begin)
                    tally.sends, tries = nginx.sends(offset)
                    tally.detail = f"nginx upstream tries {tries}"
            else:
                raise ValueError(f"unknown contender {name!r}; known: {', '.join(CONTENDERS)}")
            wall = max(tally.ended.values(), default=t0) - t0
        finally:
            await chaos.wait()  # finish the timeline (resume the hung shard) before reading counters
        counts = await asyncio.gather(*(fleet.stats(n) for n in fleet.names))
    if trace:
        print_trace(name, tally, t0, chaos, trace)
    shard_requests = requests_before_kill + sum(c.get("generation_requests", 0) for c in counts)
    latencies = [tally.ended[pid] - tally.started[pid] for pid in tally.ended]
    end = t0 + 10 * scale.duration
    killed_at, restarted_at = fault_window(chaos, FaultKind.SHARD_KILL)
    hung_at, resumed_at = fault_window(chaos, FaultKind.SHARD_HANG)
    kill_last = tally.sends.last_in(KILLED, killed_at, restarted_at or end) if killed_at else None
    hang_last = tally.sends.last_in(HUNG, hung_at, resumed_at or end) if hung_at else None
    return Row(
        name=name,
        completed=tally.completed,
        lost=len(prompts) - tally.completed - tally.wrong,
        wrong=tally.wrong,
        shard_requests=shard_requests,
        wasted=shard_requests - tally.completed,
        p50=_percentile(latencies, 0.50),
        p99=_percentile(latencies, 0.99),
        worst=max(latencies, default=float("nan")),
        kill_to_last=kill_last,
        hang_to_last=hang_last,
        wall=wall,
        late=sum(1 for latency in latencies if latency > scale.latency + 1.0),
        detail=tally.detail + (f"; first failure: {next(iter(tally.failed.values()))[:160]}" if tally.failed else ""),
    )


# -- report ---------------------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


def _ratio(peer: float | None, ours: float | None) -> str:
    if peer is None or ours is None:
        return "-"
    if ours <= 0:
        return "inf" if peer > 0 else "1.0x"
    return f"{peer / ours:.1f}x"


def report(rows: Sequence[Row]) -> None:
    print(
        f"\n{'contender':14} {'completed':>9} {'lost':>5} {'wrong':>5} {'shard reqs':>10} {'wasted':>7} "
        f"{'p50 s':>7} {'p99 s':>7} {'max s':>7} {'kill->last s':>12} {'hang->last s':>12} {'wall s':>7}"
    )
    for r in rows:
        print(
            f"{r.name:14} {r.completed:9d} {r.lost:5d} {r.wrong:5d} {r.shard_requests:10d} {r.wasted:7d} "
            f"{r.p50:7.2f} {r.p99:7.2f} {r.worst:7.2f} {_s(r.kill_to_last):>12} {_s(r.hang_to_last):>12} {r.wall:7.1f}"
        )
    for r in rows:
        if r.detail:
            print(f"  {r.name}: {r.detail}")
    print("prompts more than 1 s late: " + ", ".join(f"{r.name} {r.late}" for r in rows))
    ours = next((r for r in rows if r.name == "rollout-fleet"), None)
    if ours is None:
        return
    print(f"\n{MARKER} (peer / rollout-fleet; >1 means rollout-fleet is better):")
    print(
        f"{'contender':14} {'lost':>6} {'wasted':>8} {'p50':>7} {'p99':>7} {'kill->last':>10} {'hang->last':>10} "
        f"{'wall':>6}"
    )
    for r in rows:
        if r is ours:
            continue
        print(
            f"{r.name:14} {r.lost - ours.lost:+6d} {_ratio(r.wasted, ours.wasted):>8} {_ratio(r.p50, ours.p50):>7} "
            f"{_ratio(r.p99, ours.p99):>7} {_ratio(r.kill_to_last, ours.kill_to_last):>10} "
            f"{_ratio(r.hang_to_last, ours.hang_to_last):>10} {_ratio(r.wall, ours.wall):>6}"
        )


# -- scenario: weights (restarts plus a refit every N seconds) ---------------------------------------------------


@dataclass
class WeightsRow:
    mode: str
    committed: int
    stale_committed: int
    stale_attempts: int
    wall: float

    @property
    def goodput(self) -> float:
        """On-policy results committed per second."""
        return (self.committed - self.stale_committed) / self.wall


class _Untracked:
    """Today's behaviour: no policy version, so every answer commits (a WeightsView that knows nothing)."""

    policy_version = None

    def version_of(self, shard: str) -> None:
        return None

    def stale_shards(self) -> dict[str, bool]:
        return {}


async def drive_weights(aware: bool, scale: Scale, seed: int, refit_every: float, restart_every: float) -> WeightsRow:
    """One fleet, one trainer loop (publish v+1 and refit every shard every ``refit_every`` s with SGLang's
    ``update_weights_from_disk``) and a shard restarted every ``restart_every`` s (it comes back at base weights).
    ``aware``: the dispatcher follows the WeightsTracker (Stale until refit, max_weights_lag 0); otherwise today's
    behaviour, the same updates sent with no version check. A committed result is stale when the version it was
    produced at (the shard's ``X-Weight-Version``, read when the request started) is not the trainer's version at
    the moment the dispatcher committed it."""
    from rollout_runtime.sim import SimFaults
    from rollout_runtime.weights import SGLangWeightVersion

    slow = SimFaults(slow_seconds=scale.latency)
    names = [f"shard-{i}" for i in range(scale.shards)]
    prompts = make_prompts(scale.prompts, seed)
    async with SimFleet(scale.shards, faults=dict.fromkeys(names, slow), seed=seed) as fleet:
        import aiohttp

        identity = SGLangWeightVersion() if aware else None
        source = LocalShardSource(fleet.shards, scale.probe(), identity=identity)
        policy = scale.policy()
        weights = None if aware else _Untracked()  # None: the source's WeightsTracker
        current = {"version": 0}
        policy_at_commit: dict[int, int] = {}

        def observe(event: DispatchEvent) -> None:
            # Emitted synchronously where the dispatcher decides to commit: the trainer's version at that moment.
            if isinstance(event, AttemptEnded) and event.outcome == "success":
                policy_at_commit[int(event.prompt_id)] = current["version"]

        dispatcher = Dispatcher(
            source, policy, seed=seed, registry=CollectorRegistry(), weights=weights, observer=observe
        )
        stale_committed = 0
        async with aiohttp.ClientSession() as http, dispatcher:

            async def update(name: str, version: int) -> None:
                body = {"model_path": f"/ckpt/step-{version}", "weight_version": str(version)}
                async with http.post(f"{fleet.shard(name).endpoint}/update_weights_from_disk", json=body) as r:
                    if r.status != 200:
                        raise RuntimeError(f"update of {name} answered {r.status}")

            async def refit(version: int) -> None:
                current["version"] = version  # the trainer's policy from here on, whatever the shards hold
                if aware:
                    await source.weights.publish(version)
                    await source.weights.refit_all(version, lambda name: update(name, version))
                else:
                    await asyncio.gather(*(update(name, version) for name in names), return_exceptions=True)

            async def trainer() -> None:
                version, restarted = 0, 0
                loop = asyncio.get_running_loop()
                next_refit, next_restart = loop.time() + refit_every, loop.time() + restart_every
                while True:
                    await asyncio.sleep(max(0.0, min(next_refit, next_restart) - loop.time()))
                    if loop.time() >= next_restart:
                        await fleet.restart(names[restarted % len(names)], faults=slow)
                        restarted += 1
                        next_restart += restart_every
                    if loop.time() >= next_refit:
                        version += 1
                        await refit(version)
                        next_refit += refit_every

            async def rollout(shard: Shard, prompt: Prompt) -> str:
                body = {"model": "sim-model", "prompt": prompt[1], "max_tokens": 16}
                async with http.post(f"{shard.endpoint}/v1/completions", json=body) as response:
                    response.raise_for_status()
                    payload = await response.json()
                    version = response.headers["X-Weight-Version"]
                if aware:
                    await source.weights.observe(shard.name, f"weight_version:{version}")
                return f"{version}|{payload['choices'][0]['text']}"

            await refit(1)
            started = time.monotonic()
            train = asyncio.create_task(trainer())
            run = dispatcher.run(prompts, rollout, prompt_ids=[pid for pid, _ in prompts])
            committed = 0
            try:
                async for outcome in run:
                    if isinstance(outcome, Completed):
                        committed += 1
                        produced_at = outcome.result.split("|", 1)[0]
                        if produced_at != str(policy_at_commit[int(outcome.prompt_id)]):
                            stale_committed += 1
            finally:
                train.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await train
            wall = time.monotonic() - started
            return WeightsRow(
                "weights-aware" if aware else "weights-unaware", committed, stale_committed, run.stats.stale, wall
            )


async def weights_scenario(scale: Scale, seed: int, refit_every: float, restart_every: float) -> list[WeightsRow]:
    """Both modes on the same schedule, one after the other in one run; prints the table."""
    print(
        f"weights benchmark: {scale.shards} sim shards, {scale.prompts} prompts, {scale.concurrency} concurrent, "
        f"{scale.latency:g}s generation, a refit every {refit_every:g}s, a restart every {restart_every:g}s,"
        f" seed {seed}"
    )
    rows = [await drive_weights(aware, scale, seed, refit_every, restart_every) for aware in (True, False)]
    print(f"{'mode':<18}{'committed':>10}{'stale committed':>17}{'stale attempts':>16}{'wall s':>8}{'goodput/s':>11}")
    for row in rows:
        print(
            f"{row.mode:<18}{row.committed:>10}{row.stale_committed:>17}{row.stale_attempts:>16}"
            f"{row.wall:>8.1f}{row.goodput:>11.1f}"
        )
    return rows


def _latest(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return max(known) if known else None


def report_seeds(runs: Mapping[int, Sequence[Row]]) -> None:
    """Each contender's figures seed by seed and their median: one run's waste and tail move by as much as the
    margins between contenders, so a comparison is made on the medians over several chaos timelines."""
    seeds = list(runs)
    names = [row.name for row in runs[seeds[0]]]
    by_name = {name: [next(r for r in runs[seed] if r.name == name) for seed in seeds] for name in names}
    print(f"\nover seeds {', '.join(map(str, seeds))} (each seed's value, then the median):")
    columns: list[tuple[str, Callable[[Row], float], str]] = [
        ("lost", lambda r: r.lost, "{:.0f}"),
        ("wasted", lambda r: r.wasted, "{:.0f}"),
        ("p99 s", lambda r: r.p99, "{:.2f}"),
        ("max s", lambda r: r.worst, "{:.2f}"),
    ]
    for name, rows in by_name.items():
        cells = []
        for title, value, fmt in columns:
            values = [value(r) for r in rows]
            cells.append(f"{title} {'/'.join(fmt.format(v) for v in values)} -> {fmt.format(median(values))}")
        cells.append(f"kill->last s {'/'.join(_s(r.kill_to_last) for r in rows)}")
        cells.append(f"hang->last s {'/'.join(_s(r.hang_to_last) for r in rows)}")
        print(f"  {name:14} " + "; ".join(cells))
    medians = [
        Row(
            name=name,
            completed=round(median(r.completed for r in rows)),
            lost=round(median(r.lost for r in rows)),
            wrong=round(median(r.wrong for r in rows)),
            shard_requests=round(median(r.shard_requests for r in rows)),
            wasted=round(median(r.wasted for r in rows)),
            p50=median(r.p50 for r in rows),
            p99=median(r.p99 for r in rows),
            worst=median(r.worst for r in rows),
            kill_to_last=_latest(r.kill_to_last for r in rows),
            hang_to_last=_latest(r.hang_to_last for r in rows),
            wall=median(r.wall for r in rows),
            late=round(median(r.late for r in rows)),
        )
        for name, rows in by_name.items()
    ]
    print("\nmedians over the seeds (kill->last and hang->last: the latest over the seeds):")
    report(medians)


async def main_async(scale: Scale, seeds: Sequence[int], contenders: Sequence[str], trace: int = 0) -> None:
    runs: dict[int, list[Row]] = {}
    for seed in seeds:
        print(
            f"failover benchmark: {scale.shards} sim shards, {scale.prompts} prompts, {scale.concurrency} concurrent, "
            f"{scale.latency:g}s generation, attempt timeout {scale.attempt_timeout:g}s, {scale.tries} tries, probes "
            f"every {scale.probe_period:g}s (timeout {scale.probe_timeout:g}s, fall {scale.fall}, rise {scale.rise}), "
            f"backoff {scale.backoff_initial:g}s..{scale.backoff_max:g}s, seed {seed}"
        )
        print("chaos: " + "; ".join(fault.describe() for fault in chaos_schedule(scale, seed).faults))
        rows = runs[seed] = []
        for name in contenders:
            started = time.monotonic()
            row = await run_contender(name, scale, seed, trace)
            print(f"  {name}: done in {time.monotonic() - started:.1f}s")
            rows.append(row)
        report(rows)
    if len(seeds) > 1:
        report_seeds(runs)


# -- blame scenarios (issue 13): in-process aiohttp shards on 127.0.0.1, no chaos ----------------------------------

POISON_TEXT = "the prompt every shard answers 500"


async def _blame_fleet(count: int, status_for: Callable[[str], int]) -> tuple[list[Shard], Callable[[], int], Any]:
    """``count`` real aiohttp servers answering a completion, or ``status_for(prompt)`` when that is not 200."""
    from contextlib import AsyncExitStack

    from aiohttp import web

    answered = [0]
    stack = AsyncExitStack()

    async def route(request: web.Request) -> web.StreamResponse:
        answered[0] += 1
        prompt = (await request.json()).get("prompt", "")
        status = status_for(prompt)
        if status != 200:
            return web.json_response({"error": {"message": f"refused ({status})"}}, status=status)
        return web.json_response({"choices": [{"text": expected_answer(prompt), "finish_reason": "stop"}]})

    shards = []
    for index in range(count):
        app = web.Application()
        app.router.add_post("/v1/completions", route)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        stack.push_async_callback(runner.cleanup)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        shards.append(Shard(name=f"shard-{index}", endpoint=f"http://127.0.0.1:{port}"))
    return shards, lambda: answered[0], stack


async def scenario_poison(seed: int) -> None:
    """A poison prompt (500 on every shard, as llama.cpp answers a malformed request) among 4,800."""
    from rollout_runtime.shards import StaticShardSource

    shards, answered, stack = await _blame_fleet(6, lambda p: 500 if p == POISON_TEXT else 200)
    prompts = [f"prompt {i}" for i in range(4800)]
    prompts[2400] = POISON_TEXT
    # One prompt may be data-failed (max_skipped_prompts: the poison one); the default 0 would end the run on it.
    policy = DispatchPolicy(
        max_concurrency=32, backoff_initial_seconds=0.1, backoff_max_seconds=2.0, max_skipped_prompts=1
    )
    started = time.monotonic()
    error: BaseException | None = None
    results: dict[str, int] = {}
    async with stack, GenerationClient() as client, Dispatcher(StaticShardSource(shards), policy, seed=seed) as d:

        async def rollout(shard: Shard, prompt: str) -> str:
            return (await client.complete(shard, prompt, max_tokens=16)).text

        run = d.run(prompts, rollout)
        try:
            async for outcome in run:
                results[type(outcome).__name__] = results.get(type(outcome).__name__, 0) + 1
        except Exception as exc:
            error = exc
    print(
        f"poison prompt among {len(prompts)} on {len(shards)} shards: outcomes {results}, run error "
        f"{type(error).__name__ if error else 'none'}, healthy shards ejected {run.stats.ejections}, attempts "
        f"{run.stats.attempts} ({answered()} answered), {time.monotonic() - started:.1f}s"
    )


async def scenario_fleet_401(seed: int) -> None:
    """Every shard answers 401: attempts until the run-level error, against a naive loop over the same fleet."""
    from rollout_runtime.shards import StaticShardSource

    shards, answered, stack = await _blame_fleet(6, lambda p: 401)
    prompts = [f"prompt {i}" for i in range(200)]
    policy = DispatchPolicy(max_concurrency=32, backoff_initial_seconds=0.1, backoff_max_seconds=2.0)
    error: BaseException | None = None
    async with stack, GenerationClient() as client:
        async with Dispatcher(StaticShardSource(shards), policy, seed=seed) as d:

            async def rollout(shard: Shard, prompt: str) -> str:
                return (await client.complete(shard, prompt, max_tokens=16)).text

            run = d.run(prompts, rollout)
            try:
                async for _ in run:
                    pass
            except Exception as exc:
                error = exc
        ours = run.stats.infra_failures + run.stats.data_failures
        before_naive = answered()
        failed = 0
        for index, prompt in enumerate(prompts):  # naive: each prompt on its shard, a 401 retried as infra
            for attempt in range(1, policy.max_infra_attempts + 1):
                try:
                    await client.complete(shards[index % len(shards)], prompt, max_tokens=16)
                    break
                except RolloutFailure:
                    if attempt == policy.max_infra_attempts:
                        failed += 1
        naive = answered() - before_naive
    print(
        f"fleet-wide 401 on {len(shards)} shards, {len(prompts)} prompts: rollout-fleet ended after {ours} failed "
        f"attempts (bound 2 x shards = {2 * len(shards)}) with {type(error).__name__ if error else 'no error'}: "
        f"{error}; naive loop: {naive} attempts, {failed} prompts failed, no run-level error"
    )


def scenario_no_shards(seed: int) -> None:
    """100,000 prompts with zero healthy shards: seconds until the run raises, and the process's peak RSS."""
    import resource

    from rollout_runtime.shards import StaticShardSource

    async def go() -> tuple[float, str]:
        policy = DispatchPolicy(healthy_wait_seconds=1.0, backoff_initial_seconds=0.0, backoff_max_seconds=0.0)
        started = time.monotonic()
        async with Dispatcher(StaticShardSource([]), policy, seed=seed) as d:

            async def rollout(shard: Shard, prompt: int) -> int:
                return prompt

            try:
                async for _ in d.run(range(100_000), rollout):
                    pass
            except Exception as exc:
                return time.monotonic() - started, f"{type(exc).__name__}: {exc}"[:120]
        return time.monotonic() - started, "no error"

    seconds, error = asyncio.run(go())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"100,000 prompts, zero healthy shards (healthy wait 1 s): {seconds:.1f}s to {error}; peak RSS {peak_mb:.0f} MB"
    )


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "poison": lambda seed: asyncio.run(scenario_poison(seed)),
    "fleet-401": lambda seed: asyncio.run(scenario_fleet_401(seed)),
    "no-shards": scenario_no_shards,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--seeds", default=None, help="comma-separated seeds: one run per seed, then each contender's medians"
    )
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated subset of {CONTENDERS}")
    parser.add_argument("--trace", type=int, default=0, help="print the N slowest prompts of each contender")
    parser.add_argument("--weights", action="store_true", help="the weights scenario (restarts plus refits) instead")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), help="run one blame scenario instead")
    args = parser.parse_args()
    if args.seeds and (args.weights or args.scenario):
        parser.error("--seeds runs the failover contenders; give --seed to --weights and --scenario")
    if args.weights:
        scale = SMOKE if args.smoke else FULL
        asyncio.run(
            weights_scenario(scale, args.seed, refit_every=scale.duration / 6, restart_every=scale.duration / 5)
        )
        return
    if args.scenario:
        SCENARIOS[args.scenario](args.seed)
        return
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = set(contenders) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; known: {', '.join(CONTENDERS)}")
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")] if args.seeds else [args.seed]
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, got {args.seeds!r}")
    asyncio.run(main_async(SMOKE if args.smoke else FULL, seeds, contenders, args.trace))


if __name__ == "__main__":
    main()
