"""Benchmark 1: failover against the routers and load balancers people put in front of generation servers, over a
matrix of fault kinds, measured side by side in one run.

Every contender gets a fresh fleet of simulated shards (real subprocesses, same seed), the same prompts and the same
seeded fault schedule on the wall clock from its first request, scenario by scenario (bench/failover_scenarios.py
describes them and what decides each). Contenders:

- rollout-fleet: the Dispatcher in the trainer, with active probes (LocalShardSource) and passive ejection; streamed
  requests with the progress watchdog in the streaming scenario;
- router: ``rollout-fleet router`` (the same dispatcher behind an OpenAI-compatible endpoint);
- HAProxy and nginx (Debian packages; bench/_peers.py has their configs and why);
- vllm-router and sglang-router (PyPI wheels; bench/_field_routers.py has their flags and why);
- naive: each prompt bound to one shard, retried there with the dispatcher's budget and backoff.
The client of the routers and proxies sends each prompt once and trusts the answer (a 200 is a completion).

Probe period/timeout/thresholds, per-attempt timeout and attempt budget are the same for every contender that has
the knob. Per contender: prompts completed (correct answer), lost (not completed), of those the client-visible
errors and the corrupt ones (a 200 that was not the answer, passed on as a completion), requests that reached a shard
and those wasted, p50/p99/max prompt latency, prompts more than 1 s late, goodput (completed per second, as a share
of the same contender's fault-free run of the same scenario, charged at least that run's time), and where every
shard request went (the shards' own counters: useful, duplicate, refused at a cap, errors, malformed 200s, cut or
unanswered; they add up to the total).

    python bench/failover.py                               # the whole matrix, seed 1 (~9 minutes)
    python bench/failover.py --scenario all --seeds 1,2,3  # medians and spread over 3 seeds (~25 minutes)
    python bench/failover.py --scenario gray --contenders rollout-fleet,nginx --trace 3
    python bench/failover.py --smoke --scenario chaos      # tiny sizes (the suite; no numbers asserted)
    python bench/failover.py --weights                     # restarts plus refits: stale results committed
    python bench/failover.py --scenario poison|fleet-401|no-shards   # the blame scenarios

On real vLLM (``--shards vllm``, issue 39 part 4): ONE fleet of 3 vLLM servers (CPU build, tiny model, started
with ``--shutdown-timeout`` so that SIGTERM drains) for the whole run, since a start takes 20-70 s; every contender
in turn runs each scenario real servers can show against it (bench/failover_scenarios.py's ``on_real_shards``: the
others are skipped with the reason printed), and before each the fleet is restored (killed servers restarted,
frozen engines SIGCONTed, each answering a real 1-token generation). What differs from the sims, kept in one place
per shard kind (bench/_shard_kinds.py): an answer is good when it is well-formed (the model's weights are random;
``finish_reason`` stop/length, not empty, token counts consistent with ``usage``), and the ledger is read from vLLM's
own ``/metrics``, with ``n/a`` for the buckets its counters cannot fill (and so for ``wasted``).

    python bench/failover.py --shards vllm --scenario chaos   # one scenario, 7 contenders on 3 real servers (~30 min)
    python bench/failover.py --shards vllm                 # the applicable matrix (over an hour: restarts dominate)
    python bench/failover.py --shards vllm --smoke --scenario stream-freeze --contenders rollout-fleet,router

Needs the peers: ``bash scripts/install-tools.sh haproxy nginx router-peers`` (and ``vllm`` for real shards).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

from prometheus_client import CollectorRegistry

from _failover_special import BLAME, WEIGHTS, WEIGHTS_SMOKE, weights_scenario
from _field_routers import FieldRouter
from _peers import HAProxy, Nginx, vllm_tool
from _shard_kinds import KINDS, SIM, VLLM, ShardKind, is_na
from failover_scenarios import (
    FIGURES,
    MATRIX,
    SCENARIOS,
    SMOKE,
    VLLM_SMOKE,
    Prompt,
    Scale,
    Scenario,
    baseline,
    make_prompts,
    on_real_shards,
    rank_key,
)
from failover_scenarios import VLLM as VLLM_SCALE
from rollout_runtime.dispatch import (
    Completed,
    Dispatcher,
    DispatchEvent,
    DispatchPolicy,
    HealthyShardsChanged,
    ShardEjected,
    ShardRestored,
    backoff_seconds,
)
from rollout_runtime.failures import FailureClass, GenerationUnavailable, RolloutFailure, classify_rollout_failure
from rollout_runtime.generation import Completion, GenerationClient, GenerationOptions
from rollout_runtime.health import ProbeSettings
from rollout_runtime.router import Router, RouterConfig, serve_router
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim import SimFaults, SimFleet
from rollout_runtime.sim.chaos import Fault, FaultInjector, FaultKind
from rollout_runtime.vllm.fleet import VllmFleet

MARKER = "failover matrix ranks"
CONTENDERS = ("rollout-fleet", "router", "nginx", "haproxy", "vllm-router", "sglang-router", "naive")

# -- what every contender records -----------------------------------------------------------------------------


@dataclass
class Tally:
    """Each prompt's outcome as the contender's caller saw it, once per prompt (a second outcome is counted)."""

    kind: ShardKind = SIM
    """Whose judge says whether an answer passed on is a good one."""
    max_tokens: int = 16
    started: dict[int, float] = field(default_factory=dict)
    ended: dict[int, float] = field(default_factory=dict)
    completed: int = 0
    errors: dict[int, str] = field(default_factory=dict)
    corrupt: dict[int, str] = field(default_factory=dict)
    repeated: int = 0
    """Outcomes for a prompt that already had one (must stay 0: every prompt is accounted for exactly once)."""
    detail: str = ""
    trace: dict[int, list[tuple[float, str]]] = field(default_factory=dict)
    """Prompt -> (send time, shard) of each attempt, where the contender itself picks the shard."""
    events: list[tuple[float, str]] = field(default_factory=list)
    """What the contender's health view did and when (the dispatcher's healthy-set changes and ejections)."""

    def send(self, prompt_id: int, shard: str) -> None:
        self.trace.setdefault(prompt_id, []).append((self.start(prompt_id), shard))

    def start(self, prompt_id: int) -> float:
        now = time.monotonic()
        self.started.setdefault(prompt_id, now)
        return now

    def finish(
        self, prompt_id: int, answer: Completion | None, prompt: str, error: str | None = None, corrupt: str = ""
    ) -> None:
        """``answer`` passed on as a completion; ``error`` what the caller saw instead; ``corrupt`` a 200 the
        contender passed on that was not a completion at all. An answer the shard kind's judge rejects is corrupt."""
        if prompt_id in self.ended:
            self.repeated += 1
            return
        self.ended[prompt_id] = time.monotonic()
        self.started.setdefault(prompt_id, self.ended[prompt_id])
        problem = corrupt or (self.kind.judge(prompt, answer, self.max_tokens) if answer is not None else "no answer")
        if error is not None:
            self.errors[prompt_id] = error
        elif problem:
            self.corrupt[prompt_id] = problem
        else:
            self.completed += 1


Begin = Callable[[], float]
"""Called by a contender right before its first request: starts the fault clock, returns t0."""


@dataclass
class Run:
    """One contender's run of one scenario: what it sends and where it records."""

    scenario: Scenario
    scale: Scale
    seed: int
    prompts: list[Prompt]
    tally: Tally
    begin: Begin
    kind: ShardKind = SIM
    model: str = "sim-model"

    @property
    def options(self) -> GenerationOptions:
        return GenerationOptions(stream=bool(self.scenario.stream_tokens))

    @property
    def max_tokens(self) -> int:
        return self.scenario.max_tokens(self.scale)

    @property
    def extra(self) -> dict[str, object]:
        return dict(self.kind.request_fields)

    def probe(self) -> ProbeSettings:
        return self.scale.probe(generate=self.kind.generate_probe)

    def policy(self) -> DispatchPolicy:
        policy = self.scale.policy(len(self.prompts))
        if self.scenario.stream_tokens:  # a streaming user turns the watchdog on: a silent stream is left at once
            return policy.model_copy(
                update={"progress_watchdog": True, "progress_factor": 3.0, "progress_floor_seconds": 0.3}
            )
        return policy


# -- the contenders -------------------------------------------------------------------------------------------


Fleet = SimFleet | VllmFleet
"""The shards a contender runs against: a fresh sim fleet, or the run's one fleet of real vLLM servers."""


async def drive_rollout_fleet(fleet: Fleet, run: Run) -> None:
    tally, scale = run.tally, run.scale
    all_up = asyncio.Event()

    def observe(event: DispatchEvent) -> None:
        if isinstance(event, HealthyShardsChanged):
            if len(event.routable) == scale.shards:
                all_up.set()
            tally.events.append((time.monotonic(), f"routable {','.join(n[-1] for n in event.routable)}"))
        elif isinstance(event, ShardEjected | ShardRestored):
            tally.events.append((time.monotonic(), f"{type(event).__name__} {event.shard}"))

    source = LocalShardSource(fleet.shards, run.probe())
    client = GenerationClient(timeout_seconds=scale.attempt_timeout + 1.0, connect_timeout_seconds=1.0)
    dispatcher = Dispatcher(source, run.policy(), observer=observe, seed=run.seed, registry=CollectorRegistry())
    async with client, dispatcher:
        await asyncio.wait_for(all_up.wait(), 30.0)

        async def rollout(shard: Shard, prompt: Prompt) -> Completion:
            tally.send(prompt[0], shard.name)
            return await client.complete(
                shard, prompt[1], max_tokens=run.max_tokens, options=run.options, extra=run.extra
            )

        texts = dict(run.prompts)
        outcomes = dispatcher.run(run.prompts, rollout, prompt_ids=[pid for pid, _ in run.prompts])
        run.begin()
        ended = ""
        try:
            async for outcome in outcomes:
                pid = int(outcome.prompt_id)
                if isinstance(outcome, Completed):
                    tally.finish(pid, outcome.result, texts[pid])
                else:
                    tally.finish(pid, None, texts[pid], error=f"{type(outcome).__name__}: {outcome.reason}")
        except RolloutFailure as exc:  # the run ended early: the prompts without an outcome count as errors
            ended = f"; the run raised {type(exc).__name__}: {str(exc)[:120]}"
        st = outcomes.stats
        tally.detail = (
            f"dispatcher attempts: {st.successes} ok, {st.infra_failures} infra-failed, {st.data_failures} "
            f"data-failed, {st.cancelled} evicted; {st.ejections} ejections, {st.skipped} skipped{ended}"
        )


async def _workers(prompts: list[Prompt], concurrency: int, one: Callable[[Prompt], Awaitable[None]]) -> None:
    queue: asyncio.Queue[Prompt] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)

    async def work() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    await asyncio.gather(*(work() for _ in range(concurrency)))


async def drive_through_proxy(url: str, run: Run) -> None:
    """The naive client: one request per prompt to the front, whose own retries are all the failover there is.
    An unstreamed 200 that is not a completion was passed on by the front as one: corrupt, not an error."""
    tally, scale = run.tally, run.scale
    front = Shard(name="front", endpoint=url, model=run.model)
    # Long enough that the front's own retries (tries x attempt timeout) finish before the client gives up.
    timeout = scale.tries * scale.attempt_timeout + 5.0
    async with GenerationClient(timeout_seconds=timeout, connect_timeout_seconds=1.0) as client:

        async def one(prompt: Prompt) -> None:
            pid, text = prompt
            tally.start(pid)
            try:
                answer = await client.complete(
                    front, text, max_tokens=run.max_tokens, options=run.options, extra=run.extra
                )
            except GenerationUnavailable as exc:
                # An unstreamed 200 is the front's word that this is a completion; a stream that carries an error
                # event (how vLLM and the routers end a stream they cannot finish) or is cut is an error to any
                # streaming client. A stream that ends properly with the wrong text is corrupt (the text check).
                if exc.status == 200 and not run.options.stream:
                    tally.finish(pid, None, text, corrupt=f"not a completion: {str(exc)[:120]}")
                else:
                    tally.finish(pid, None, text, error=f"{type(exc).__name__}: {exc}")
            except RolloutFailure as exc:
                tally.finish(pid, None, text, error=f"{type(exc).__name__}: {exc}")
            else:
                tally.finish(pid, answer, text)

        run.begin()
        await _workers(run.prompts, scale.concurrency, one)


async def drive_router(fleet: Fleet, run: Run) -> None:
    """``rollout-fleet router`` in front of the fleet, the proxies' naive client in front of it."""
    scale = run.scale
    all_up = asyncio.Event()

    def observe(event: DispatchEvent) -> None:
        if isinstance(event, HealthyShardsChanged) and len(event.routable) == scale.shards:
            all_up.set()

    config = RouterConfig(
        read_timeout_seconds=scale.attempt_timeout,
        connect_timeout_seconds=1.0,
        max_attempts=scale.tries,
        healthy_wait_seconds=scale.healthy_wait,
    )
    source = LocalShardSource(fleet.shards, run.probe())
    async with Router(source, config, observer=observe) as router, serve_router(router) as server:
        await asyncio.wait_for(all_up.wait(), 30.0)
        await drive_through_proxy(server.url, run)
        st = router.dispatcher.metrics
        run.tally.detail = f"router ejections {sum(st.ejections.values())}, redispatches {st.redispatches}"


async def drive_naive(fleet: Fleet, run: Run) -> None:
    """Each prompt bound to shard ``id % N``; infra failures retried there with the dispatcher's budget and backoff."""
    tally, scale, shards = run.tally, run.scale, fleet.shards
    policy = run.policy()
    rng = random.Random(run.seed)
    async with GenerationClient(timeout_seconds=scale.attempt_timeout, connect_timeout_seconds=1.0) as client:

        async def one(prompt: Prompt) -> None:
            pid, text = prompt
            shard = shards[pid % len(shards)]
            error = "never tried"
            for attempt in range(1, scale.tries + 1):
                tally.send(pid, shard.name)
                try:
                    answer = await client.complete(
                        shard, text, max_tokens=run.max_tokens, options=run.options, extra=run.extra
                    )
                except RolloutFailure as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    if classify_rollout_failure(exc) is FailureClass.DATA:
                        break
                    if attempt < scale.tries:
                        await asyncio.sleep(backoff_seconds(policy, attempt, rng.random()))
                else:
                    tally.finish(pid, answer, text)
                    return
            tally.finish(pid, None, text, error=error)

        run.begin()
        await _workers(run.prompts, scale.concurrency, one)


async def drive(name: str, fleet: Fleet, run: Run) -> None:
    """Run contender ``name`` against ``fleet``."""
    ports = {shard.name: int(shard.endpoint.rsplit(":", 1)[1]) for shard in fleet.shards}
    if name == "rollout-fleet":
        await drive_rollout_fleet(fleet, run)
    elif name == "router":
        await drive_router(fleet, run)
    elif name == "naive":
        await drive_naive(fleet, run)
    elif name == "haproxy":
        async with HAProxy(ports, run.scale.proxy()) as haproxy:
            await haproxy.wait_all_up()
            haproxy.start_polling()
            await drive_through_proxy(haproxy.url, run)
            await haproxy.stop_polling()
            retries = sum(c["wretr"] for c in haproxy.counters.values())
            redispatches = sum(c["wredis"] for c in haproxy.counters.values())
            run.tally.detail = f"haproxy retries {retries}, redispatches {redispatches}"
    elif name == "nginx":
        async with Nginx(ports, run.scale.proxy()) as nginx:
            await drive_through_proxy(nginx.url, run)
    elif name in ("vllm-router", "sglang-router"):
        async with FieldRouter(name, [shard.endpoint for shard in fleet.shards], run.scale.proxy()) as front:
            await drive_through_proxy(front.url, run)
    else:
        raise ValueError(f"unknown contender {name!r}; known: {', '.join(CONTENDERS)}")


# -- one contender end to end ---------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    prompts: int
    completed: int
    lost: int
    errors: int
    corrupt: int
    repeated: int
    wasted: float
    """Shard requests that were not the committed answer; NaN (n/a) when a ledger bucket is."""
    p50: float
    p99: float
    worst: float
    late: int
    """Prompts that took more than 1 s longer than an undisturbed generation."""
    wall: float
    rate: float
    """Prompts completed per second of the run."""
    ledger: dict[str, float]
    """:data:`~_shard_kinds.LEDGER`'s buckets; NaN (n/a) where the shards' counters cannot fill one."""
    hits: dict[str, float]
    """Proof the faults hit: the injector's applied faults and the shards' fault counters."""
    goodput: float = float("nan")
    """The share of the fault-free rate this run kept (:func:`goodput`; 1.0: no loss)."""
    fault_free_wall: float = float("nan")
    """Seconds the same contender's fault-free run of the same scenario took for the same prompts."""
    detail: str = ""

    def figures(self) -> dict[str, float]:
        return {column: float(getattr(self, column)) for column in FIGURES}


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
    print(f"  trace {name}: faults at {'; '.join(marks)}")
    changes = [f"{at - t0:.2f}s {what}" for at, what in tally.events if at >= t0]
    if changes:
        print(f"    health view: {'; '.join(changes)}")
    slowest = sorted(tally.ended, key=lambda pid: tally.ended[pid] - tally.started[pid], reverse=True)[:count]
    for pid in slowest:
        tries = ", ".join(f"{at - t0:.2f}s {shard}" for at, shard in tally.trace.get(pid, []))
        took = tally.ended[pid] - tally.started[pid]
        why = tally.errors.get(pid) or tally.corrupt.get(pid) or ""
        print(f"    prompt {pid}: {took:.2f}s, ended {tally.ended[pid] - t0:.2f}s [{tries}] {why[:160]}")


def goodput(completed: int, wall: float, fault_free_wall: float, prompts: int) -> float:
    """Prompts completed per second, as a share of the fault-free run's rate (which completes every prompt). A run
    is charged at least the fault-free run's time: one that ends early because it gave prompts up has not done the
    batch sooner (the trainer still needs those prompts)."""
    return (completed / max(wall, fault_free_wall)) / (prompts / fault_free_wall)


_RESTARTS = (FaultKind.SHARD_KILL, FaultKind.ALL_SHARDS_DOWN)


async def run_contender(
    name: str, scenario: Scenario, scale: Scale, seed: int, trace: int = 0, vllm: VllmFleet | None = None
) -> Row:
    """One contender, one scenario, one seed: on a fresh fleet of sim shards, or on ``vllm`` (the run's one fleet of
    real servers, every contender in turn: restored to health first, so each starts from the same fleet)."""
    if vllm is None:
        base = SimFaults(token_delay_seconds=scenario.token_delay(scale))
        faults = dict.fromkeys([f"shard-{i}" for i in range(scale.shards)], base)
        extra = ("--slow", str(scale.latency))
        async with SimFleet(scale.shards, seed=seed, extra_args=extra, faults=faults) as fleet:
            return await run_on(fleet, SIM, name, scenario, scale, seed, trace)
    restarted = await vllm.restore()
    if restarted:
        print(f"    (restarted {', '.join(restarted)}: the last run left them unwell)")
    return await run_on(vllm, VLLM, name, scenario, scale, seed, trace)


async def run_on(
    fleet: Fleet, kind: ShardKind, name: str, scenario: Scenario, scale: Scale, seed: int, trace: int
) -> Row:
    """Run contender ``name`` against a healthy ``fleet`` under the scenario's seeded faults; read its ledger from the
    shards' counters (what they served during this run: a real fleet's counters from before it are subtracted)."""
    prompts = make_prompts(scenario, scale, seed)
    tally = Tally(kind=kind, max_tokens=scenario.max_tokens(scale))
    t0 = 0.0
    before_restart: list[Mapping[str, int]] = []
    initial = [] if kind is SIM else list(await asyncio.gather(*(fleet.stats(n) for n in fleet.names)))

    async def keep_counters(fault: Fault) -> None:
        """A restarted shard counts from zero: keep what a killed one had served (a SIGTERMed one hands its counters
        over itself; the injector keeps them)."""
        if fault.kind in _RESTARTS:
            targets = fleet.names if fault.kind is FaultKind.ALL_SHARDS_DOWN else [fault.target]
            for target in targets:
                with contextlib.suppress(Exception):
                    before_restart.append(await asyncio.wait_for(fleet.stats(target), 2.0))

    chaos = FaultInjector(fleet, scenario.schedule(scale, seed), before_apply=keep_counters)

    def begin() -> float:
        nonlocal t0
        t0 = chaos.start_clock()
        return t0

    try:
        await drive(name, fleet, Run(scenario, scale, seed, prompts, tally, begin, kind, fleet.model))
        wall = max(tally.ended.values(), default=t0) - t0
    finally:
        if kind is SIM:
            await chaos.wait()  # finish the timeline (resume, restart, clear) before reading counters
        else:
            # Every fault is applied (at most the timeline's ~10 s), then the steps still to come once every prompt has
            # ended, which measure nothing and on real servers are minutes of restarts (a rolling restart's later
            # servers), are not run: what is applied is undone (restarted, thawed) and waited for.
            if t0:  # the clock runs: its faults all start within the timeline (a run that never began has none)
                await chaos.until_applied(len(chaos.schedule.faults))
            await chaos.close()
    read = await asyncio.gather(*(fleet.stats(n) for n in fleet.names), return_exceptions=True)
    unread = [n for n, c in zip(fleet.names, read, strict=True) if isinstance(c, BaseException)]
    counts = [c for c in read if not isinstance(c, BaseException)]
    if trace:
        print_trace(name, tally, t0, chaos, trace)
    drained = [stats for r in chaos.injected for stats in r.detail.get("final_stats", [])]
    counters = counts + before_restart + drained + [{k: -v for k, v in c.items()} for c in initial]
    ledger = kind.ledger(counters, tally.completed)
    summed: Counter[str] = Counter()
    for counter in counters:
        summed.update(counter)
    hits: dict[str, float] = {
        "faults_applied": sum(1 for r in chaos.injected if "error" not in r.detail),
        "faults_scheduled": len(chaos.schedule.faults),
        "slowed": summed["slowed"],
        "terminated": sum(len(r.detail.get("final_stats", [])) for r in chaos.injected),
        **{key: ledger[key] for key in ("refused", "errors", "malformed", "cut")},
        **kind.hits(counters),
    }
    latencies = [tally.ended[pid] - tally.started[pid] for pid in tally.ended]
    lost = len(prompts) - tally.completed
    first_failure = next(iter((tally.errors | tally.corrupt).values()), "")
    unapplied = "; ".join(chaos.errors)
    return Row(
        name=name,
        prompts=len(prompts),
        completed=tally.completed,
        lost=lost,
        errors=len(tally.errors) + (lost - len(tally.errors) - len(tally.corrupt)),  # never ended: an error too
        corrupt=len(tally.corrupt),
        repeated=tally.repeated,
        wasted=sum(ledger.values()) - ledger["useful"],
        p50=_percentile(latencies, 0.50),
        p99=_percentile(latencies, 0.99),
        worst=max(latencies, default=float("nan")),
        late=sum(1 for latency in latencies if latency > scenario.generation_seconds(scale) + 1.0),
        wall=wall,
        rate=tally.completed / wall if wall > 0 else 0.0,
        ledger=ledger,
        hits=hits,
        detail="; ".join(
            filter(
                None,
                (
                    tally.detail,
                    first_failure and f"first failure: {first_failure[:160]}",
                    unapplied and f"faults not applied: {unapplied[:300]}",
                    unread and f"counters unreadable (left out of the ledger): {', '.join(unread)}",
                ),
            )
        ),
    )


# -- report ---------------------------------------------------------------------------------------------------

_COLUMNS = ["completed", "lost", "errors", "corrupt", "wasted", "p50", "p99", "max", "late", "goodput"]


def _count(value: float) -> str:
    return "n/a" if is_na(value) else f"{value:.0f}"


def _cells(row: Mapping[str, float]) -> list[str]:
    pct = "-" if row["goodput"] != row["goodput"] else f"{100 * row['goodput']:.0f}%"
    ints = [_count(row[k]) for k in ("completed", "lost", "errors", "corrupt", "wasted")]
    return [*ints, f"{row['p50']:.2f}", f"{row['p99']:.2f}", f"{row['worst']:.2f}", f"{row['late']:.0f}", pct]


Table = dict[str, dict[str, float]]
"""Contender -> its (median) figures."""


def ranked(scenario: Scenario, table: Table) -> list[str]:
    """The contenders, best first by the scenario's figure of merit (then its tiebreak)."""
    return sorted(table, key=lambda name: rank_key(scenario, {k: table[name][k] for k in FIGURES}))


def report_scenario(scenario: Scenario, table: Table, spread: Mapping[str, str]) -> None:
    print(f"\n{scenario.name}: {scenario.summary}; decided by {scenario.figure} ({scenario.question})")
    print(f"  {'rank':4} {'contender':14} " + " ".join(f"{c:>9}" for c in _COLUMNS) + f"  {scenario.figure} spread")
    for rank, name in enumerate(ranked(scenario, table), 1):
        cells = " ".join(f"{c:>9}" for c in _cells(table[name]))
        print(f"  {rank:<4} {name:14} {cells}  {spread.get(name, '')}")


def markdown(scenario: Scenario, table: Table, spread: Mapping[str, str]) -> str:
    head = "| rank | contender | " + " | ".join(_COLUMNS) + f" | {scenario.figure} per seed |"
    lines = [head, "|" + "---|" * (len(_COLUMNS) + 3)]
    for rank, name in enumerate(ranked(scenario, table), 1):
        lines.append(f"| {rank} | {name} | " + " | ".join(_cells(table[name])) + f" | {spread.get(name, '')} |")
    return "\n".join(lines)


def medians(rows: Sequence[Row]) -> dict[str, float]:
    flat = [asdict(r) for r in rows]
    out: dict[str, float] = {}
    for key in ("completed", "lost", "errors", "corrupt", "wasted", "p50", "p99", "worst", "late", "goodput"):
        values = [float(f[key]) for f in flat if f[key] == f[key]]
        out[key] = median(values) if values else float("nan")
    return out


def summarize(scenario: Scenario, by_seed: Mapping[int, Sequence[Row]], ranks: list[tuple[str, list[str]]]) -> str:
    """Print the scenario's table of medians over the seeds; add its ranking to ``ranks``; return it as markdown."""
    names = list(dict.fromkeys(row.name for rows in by_seed.values() for row in rows))  # a failed run is left out
    per_name = {name: [r for rows in by_seed.values() for r in rows if r.name == name] for name in names}
    table = {name: medians(rows) for name, rows in per_name.items()}
    spread = {name: "/".join(_fmt(r.figures()[scenario.figure]) for r in rows) for name, rows in per_name.items()}
    report_scenario(scenario, table, spread)
    ranks.append((scenario.name, ranked(scenario, table)))
    return f"### {scenario.name}\n\n{markdown(scenario, table, spread)}"


def report_saved(path: Path) -> str:
    """The tables and ranks of a saved run (``--json``), judged by the scenarios as they are now described."""
    saved = json.loads(path.read_text())
    ranks: list[tuple[str, list[str]]] = []
    tables = []
    for name, by_seed in saved.items():
        rows = {int(seed): [Row(**row) for row in seed_rows] for seed, seed_rows in by_seed.items()}
        for row in (row for seed_rows in rows.values() for row in seed_rows):
            if row.fault_free_wall != row.fault_free_wall and row.goodput > 0:  # saved before it was: rate / goodput
                row.fault_free_wall = row.prompts / (row.rate / row.goodput)
            row.goodput = goodput(row.completed, row.wall, row.fault_free_wall, row.prompts)
        tables.append(summarize(SCENARIOS[name], rows, ranks))
    print(f"\n{MARKER}:")
    for name, order in ranks:
        print(f"  {name:16} " + " > ".join(order))
    return "\n\n".join(tables) + "\n"


def _fmt(value: float) -> str:
    return "-" if value != value else (f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.2f}")


async def main_async(
    scenarios: Sequence[Scenario],
    scale: Scale,
    seeds: Sequence[int],
    contenders: Sequence[str],
    options: Options,
    vllm: VllmFleet | None = None,
) -> tuple[dict[str, object], str]:
    """Run every scenario on every seed (on ``vllm``, the ones real servers can show); return each seed's rows by
    scenario, and the tables as markdown."""
    results: dict[str, object] = {}
    markdowns: list[str] = []
    ranks: list[tuple[str, list[str]]] = []
    base_wall: dict[tuple[int, str], float] = {}
    began = time.monotonic()
    for scenario in scenarios:
        kind = "sim shards"
        if vllm is not None:
            kind = "real vLLM servers"
            real, note = on_real_shards(scenario, scale)
            if real is None:
                print(f"\n== {scenario.name}: skipped on real vLLM: {note}")
                continue
            scenario = real
            if note:
                print(f"\n== {scenario.name} on real vLLM runs {note}")
        print(
            f"\n== {scenario.name}: {scale.shards} {kind}, {scenario.prompt_count(scale)} prompts, "
            f"{scale.concurrency} concurrent, {scenario.generation_seconds(scale):g}s per generation, attempt timeout "
            f"{scale.attempt_timeout:g}s, {scale.tries} tries, probes every {scale.probe_period:g}s"
        )
        by_seed: dict[int, list[Row]] = {}
        for seed in seeds:
            print(f"  seed {seed}: " + "; ".join(f.describe() for f in scenario.schedule(scale, seed).faults))
            rows = by_seed[seed] = []
            for name in contenders:
                started = time.monotonic()
                try:
                    if options.baseline and (scenario.stream_tokens, name) not in base_wall:
                        free = await run_contender(name, baseline(scenario), scale, seeds[0], vllm=vllm)
                        base_wall[scenario.stream_tokens, name] = free.wall
                        print(f"    {name} fault-free: {free.completed} in {free.wall:.1f}s ({free.rate:.0f}/s)")
                    row = await run_contender(name, scenario, scale, seed, options.trace, vllm=vllm)
                except Exception as exc:
                    if vllm is None:
                        raise
                    # One fleet serves the whole run: a contender that cannot run (a peer that will not start) is
                    # reported and left out of the table rather than losing every other row.
                    print(f"    {name}: FAILED TO RUN ({type(exc).__name__}: {str(exc)[:300]}); left out")
                    continue
                if (scenario.stream_tokens, name) in base_wall:
                    row.fault_free_wall = base_wall[scenario.stream_tokens, name]
                    row.goodput = goodput(row.completed, row.wall, row.fault_free_wall, row.prompts)
                rows.append(row)
                ledger = ", ".join(f"{k} {_count(v)}" for k, v in row.ledger.items())
                extra = ", ".join(
                    f"{k} {_count(row.hits[k])}" for k in ("aborted", "generated_tokens") if k in row.hits
                )
                applied = f"faults applied {row.hits['faults_applied']:.0f}/{row.hits['faults_scheduled']:.0f}"
                if row.hits.get("terminated"):
                    applied += f" ({row.hits['terminated']:.0f} shards SIGTERMed)"
                print(
                    f"    {name}: {applied}; {row.completed} completed, {row.errors} errors, {row.corrupt} corrupt, "
                    f"p99 {row.p99:.2f}s, {row.wall:.1f}s ({time.monotonic() - started:.0f}s with setup); "
                    f"shard requests {_count(sum(row.ledger.values()))} = {ledger}{extra and f' ({extra})'}; "
                    f"{row.detail}"
                )
        markdowns.append(summarize(scenario, by_seed, ranks))
        results[scenario.name] = {str(s): [asdict(r) for r in rows] for s, rows in by_seed.items()}
        if options.save is not None:  # after every scenario: a long real run that dies keeps what it measured
            options.save(results, "\n\n".join(markdowns) + "\n")
    print(f"\n(all scenarios took {time.monotonic() - began:.0f}s)")
    print(f"\n{MARKER} (by each scenario's figure of merit, medians over seeds {', '.join(map(str, seeds))}):")
    for name, order in ranks:
        print(f"  {name:16} " + " > ".join(order))
    return results, "\n\n".join(markdowns) + "\n"


@dataclass(frozen=True)
class Options:
    trace: int = 0
    baseline: bool = True
    save: Callable[[dict[str, object], str], None] | None = None
    """Called with the rows so far and their tables after each scenario (``--json``, ``--markdown``)."""


SHUTDOWN_TIMEOUT_SECONDS = 10
"""vLLM's ``--shutdown-timeout`` for the real fleet: on SIGTERM it drains what is in flight for up to this long (without
it, it fails every in-flight request with 500). A graceful stop as a Deployment configures one: far above a
generation's time here (an 80-token stream takes about a second), below Kubernetes' default 30 s grace period."""


async def on_vllm(
    scenarios: Sequence[Scenario], scale: Scale, seeds: Sequence[int], contenders: Sequence[str], options: Options
) -> tuple[dict[str, object], str]:
    """Start one fleet of real vLLM servers (20-70 s each: once per run, never per contender) and run the matrix on
    it. The servers' logs stay in a temporary directory, printed."""
    tool = vllm_tool()
    model = tool.tiny_model().v1
    logs = Path(tempfile.mkdtemp(prefix="failover-vllm-"))
    extra = ("--shutdown-timeout", str(SHUTDOWN_TIMEOUT_SECONDS))
    started = time.monotonic()
    async with VllmFleet(scale.shards, tool.python, model, logs, name_prefix="shard-", extra_args=extra) as fleet:
        print(f"started {scale.shards} vLLM servers in {time.monotonic() - started:.0f}s (logs in {logs})")
        await fleet.restore()  # each answers a generation, not only /health
        return await main_async(scenarios, scale, seeds, contenders, options, vllm=fleet)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    known = ["all", *SCENARIOS, *BLAME]
    parser.add_argument("--scenario", default="all", help=f"one of {', '.join(known)}")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no fault-free baseline (the suite)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", default=None, help="comma-separated seeds: one run each, then medians and spread")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated subset of {CONTENDERS}")
    parser.add_argument("--trace", type=int, default=0, help="print the N slowest prompts of each contender")
    parser.add_argument("--json", default=None, help="write every row of every seed to this file")
    parser.add_argument("--markdown", default=None, help="write the median tables as markdown to this file")
    parser.add_argument("--weights", action="store_true", help="the weights scenario (restarts plus refits) instead")
    parser.add_argument("--report", default=None, help="print the tables of a run saved with --json; run nothing")
    parser.add_argument(
        "--shards", choices=sorted(KINDS), default="sim", help="sim shards (a fresh fleet per contender) or 3 real vLLM"
    )
    args = parser.parse_args()
    if args.scenario not in known:
        parser.error(f"unknown scenario {args.scenario!r}; known: {', '.join(known)}")
    if args.report:
        tables = report_saved(Path(args.report))
        if args.markdown:
            Path(args.markdown).write_text(tables)
        return
    if args.weights:
        scale = WEIGHTS_SMOKE if args.smoke else WEIGHTS
        asyncio.run(
            weights_scenario(scale, args.seed, refit_every=scale.duration / 6, restart_every=scale.duration / 5)
        )
        return
    if (args.scenario in BLAME or args.weights) and args.shards != "sim":
        parser.error("the blame and weights scenarios run on sim shards only")
    if args.scenario in BLAME:
        BLAME[args.scenario](args.seed)
        return
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = set(contenders) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; known: {', '.join(CONTENDERS)}")
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")] if args.seeds else [args.seed]
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, got {args.seeds!r}")
    scenarios = list(SCENARIOS.values()) if args.scenario == "all" else [SCENARIOS[args.scenario]]

    def save(results: dict[str, object], tables: str) -> None:
        if args.markdown:
            Path(args.markdown).write_text(tables)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))

    options = Options(trace=args.trace, baseline=not args.smoke, save=save)
    if args.shards == "vllm":
        scale = VLLM_SMOKE if args.smoke else VLLM_SCALE
        asyncio.run(on_vllm(scenarios, scale, seeds, contenders, options))
    else:
        asyncio.run(main_async(scenarios, SMOKE if args.smoke else MATRIX, seeds, contenders, options))


if __name__ == "__main__":
    main()
