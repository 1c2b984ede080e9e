"""The failover benchmark's scenarios: pure descriptions, no I/O. bench/failover.py runs them.

A :class:`Scenario` is a name, what it asks of the fleet (short answers, or long streamed generations), a seeded
fault schedule (``schedule(scale, seed)``: the same for every contender of a run) and its figure of merit: the one
column that decides it, read as the question a user would ask of that fault. :data:`SCENARIOS` holds the matrix:

==================  ==========================================================================  =================
scenario            faults (every one applied for real to shard processes by the FaultInjector)  decided by
==================  ==========================================================================  =================
chaos               SIGKILL one shard, SIGSTOP one, one flapping, 503 bursts on the others       lost
slow-shard          one shard 10x slower, never failing                                          > 1 s late
rolling-restart     SIGTERM (graceful) one shard at a time, each healthy before the next         client errors
gray                two shards answer 200 with malformed or empty bodies, /health stays 200     corrupt
backpressure        every shard caps its concurrency, 429 with Retry-After beyond it             goodput
stream-freeze       long streamed generations; two shards SIGSTOPped mid-stream                  lost, > 1 s late
fleet-outage        every shard SIGKILLed at once, all restarted a moment later                  lost
==================  ==========================================================================  =================

On real vLLM servers (``bench/failover.py --shards vllm``, sizes :data:`VLLM`) a scenario runs as
:func:`on_real_shards` makes it: only the faults a real server takes (SIGKILL, SIGSTOP of the engine core, SIGTERM,
every server killed; :data:`REAL_KINDS`) on the shards that exist (three). So ``chaos`` keeps its SIGKILL and its
SIGSTOP and drops the flapping and the 503 bursts; ``slow-shard`` (nothing left), ``gray`` and ``backpressure``
(``Scenario.sim_only``: a real server cannot be told to answer junk or to cap itself) are skipped with the reason
printed. A real restart takes 20-70 s, longer than a run's prompts last: in ``rolling-restart`` the prompts meet the
first SIGTERM, its drain and the wait for that server to come back, and the steps still to come when the last prompt
ends are not run (they would measure nothing; bench/failover.py ends the timeline there, undoing what is applied).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, get_args

from _peers import ProxySettings
from rollout_runtime.dispatch import DispatchPolicy
from rollout_runtime.health import ProbeSettings
from rollout_runtime.sim.chaos import FLEET_TARGET, Fault, FaultKind, FaultSchedule


@dataclass(frozen=True)
class Scale:
    """The size of a run and the settings every contender that has the knob shares."""

    shards: int
    concurrency: int
    duration: float
    """Length of the fault timeline; the prompt count makes an undisturbed run last about this long."""
    latency: float
    """Simulated generation time per request (the sims' ``--slow``; a stream's time to its first token)."""
    attempt_timeout: float
    probe_period: float
    probe_timeout: float
    backoff_initial: float
    backoff_max: float
    tries: int = 5
    fall: int = 2
    rise: int = 2
    restart_seconds: float = 5.0
    """The longest a restart of the whole fleet takes (sims: a few seconds); a contender that can wait for a healthy
    shard waits at least this long."""
    stream_max_tokens: int = 0
    """Tokens a streamed answer asks for on real shards, which pace themselves (0: the scenario's word count, which
    the sims pace by ``token_delay``)."""

    @property
    def healthy_wait(self) -> float:
        """How long a contender that can wait for a healthy shard does (a fleet restart takes a few seconds)."""
        return max(30.0, 5 * self.duration, 2 * self.restart_seconds)

    def probe(self, *, generate: bool = False) -> ProbeSettings:
        return ProbeSettings(
            period_seconds=self.probe_period,
            timeout_seconds=self.probe_timeout,
            failure_threshold=self.fall,
            success_threshold=self.rise,
            check_model=True,
            generate=generate,
        )

    def policy(self, prompts: int) -> DispatchPolicy:
        return DispatchPolicy(
            max_infra_attempts=self.tries,
            backoff_initial_seconds=self.backoff_initial,
            backoff_max_seconds=self.backoff_max,
            max_concurrency=self.concurrency,
            attempt_timeout_seconds=self.attempt_timeout,
            healthy_wait_seconds=self.healthy_wait,
            # Count a prompt that runs out of budget as lost; never end the run.
            max_skipped_prompts=prompts,
            max_consecutive_dropped_prompts=prompts,
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


MATRIX = Scale(6, 24, 4.0, 0.2, 4.0, 0.5, 0.25, 0.1, 2.0)
SMOKE = Scale(4, 8, 2.0, 0.05, 1.5, 0.25, 0.15, 0.05, 0.5)

VLLM = Scale(
    shards=3,
    # 4 requests in flight per server: far below the 64 at which one server's throughput saturates, so when one
    # server is down or frozen the other two absorb its share without queueing much, and the fault-free run leaves
    # the 2 cores headroom (lateness then measures the faults, not the machine).
    concurrency=12,
    # The fault timeline: every fault of a scenario lands within ~10 s. A run is bound by the restarts, not by the
    # prompts: a restart took 2-3 min beside two idle servers and a cold start of three 348 s (first real run,
    # 2026-12-07), so the whole applicable matrix takes over an hour, not 20 minutes (docs/benchmarks.md).
    duration=10.0,
    # Measured fault-free: 600 16-token answers at 12 concurrent over the 3 servers in 38 s (16 req/s; each engine
    # has one thread, the three share 2 cores), so an undisturbed answer takes ~0.75 s.
    latency=0.75,
    # The sim matrix's ratio for streams: 4x an undisturbed streamed answer (80 tokens, ~3.75 s), 20x a short one.
    attempt_timeout=15.0,
    # Probes every second within 0.5 s: a 1-token generate probe waits its turn behind a batch step with room to
    # spare on a busy machine, and a frozen engine still leaves within 2 x 1 + 0.5 s.
    probe_period=1.0,
    probe_timeout=0.5,
    backoff_initial=0.1,
    backoff_max=2.0,
    # Three servers starting at once on 2 cores took 348 s: a contender that can wait for the fleet waits 600 s
    # (2 x 300: the most the router's ``healthy_wait_seconds`` takes).
    restart_seconds=300.0,
    # A streamed answer is 5x a short one (80 tokens), as the sims' streams are 5x their short answers' time.
    stream_max_tokens=80,
)
"""Real vLLM (CPU build, tiny model) on this 2-core machine: why each value is what it is is said beside it."""
VLLM_SMOKE = dataclasses.replace(VLLM, concurrency=6, duration=3.0, stream_max_tokens=16)
"""The suite's run on real servers: a few dozen prompts, the same timeouts (no timing is asserted)."""

Column = Literal["lost", "errors", "corrupt", "p99", "late", "goodput", "wasted"]
"""The figures a scenario can be decided by (each a field of bench/failover.py's Row)."""
FIGURES: tuple[Column, ...] = get_args(Column)
HIGHER_IS_BETTER: frozenset[Column] = frozenset({"goodput"})


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    figure: Column
    """The column that decides the scenario; ``tiebreak`` decides between equals."""
    tiebreak: Column
    question: str
    """What the figure answers, as a user would ask it."""
    schedule: Callable[[Scale, int], FaultSchedule]
    stream_tokens: int = 0
    """0: short answers, unstreamed. N: every prompt asks for an N-word answer, streamed, one word per chunk."""
    hit: str = "faults_applied"
    """The ledger entry that proves the faults hit (must be > 0 in a smoke run): a shard-side count, or
    ``faults_applied`` for faults on processes (signals), which the injector records."""
    sim_only: bool = False
    """A fault only the sim can show (a real server cannot be told to answer junk or cap itself)."""

    def token_delay(self, scale: Scale) -> float:
        """Seconds between streamed words: a stream lasts about 4x a short answer's time after its first token."""
        return 0.0 if not self.stream_tokens else 4 * scale.latency / self.stream_tokens

    def generation_seconds(self, scale: Scale) -> float:
        """An undisturbed generation's time (what "late" is measured from)."""
        return scale.latency + self.stream_tokens * self.token_delay(scale)

    def prompt_count(self, scale: Scale) -> int:
        return int(scale.duration * scale.concurrency / self.generation_seconds(scale))

    def max_tokens(self, scale: Scale | None = None) -> int:
        if scale is not None and self.stream_tokens and scale.stream_max_tokens:
            return scale.stream_max_tokens
        return max(16, self.stream_tokens)


def shard_names(scale: Scale) -> list[str]:
    return [f"shard-{i}" for i in range(scale.shards)]


Prompt = tuple[int, str]


def make_prompts(scenario: Scenario, scale: Scale, seed: int) -> list[Prompt]:
    """Arithmetic questions (one-word answers), or ``reverse: w1 .. wN`` for N-word streamed answers."""
    rng = random.Random(seed)
    prompts: list[Prompt] = []
    for i in range(scenario.prompt_count(scale)):
        if scenario.stream_tokens:
            words = " ".join(f"w{rng.randint(0, 999)}" for _ in range(scenario.stream_tokens))
            prompts.append((i, f"reverse: {words}"))
        else:
            prompts.append((i, f"What is {rng.randint(2, 999)} {rng.choice('+-*')} {rng.randint(2, 999)}?"))
    return prompts


# -- the schedules ------------------------------------------------------------------------------------------------

KILLED, HUNG, FLAPPING = "shard-1", "shard-2", "shard-3"


def no_faults(scale: Scale, seed: int) -> FaultSchedule:
    return FaultSchedule.of([], seed=seed)


def chaos(scale: Scale, seed: int) -> FaultSchedule:
    """Kill/restart, hang/resume, flapping, and 503 bursts (the benchmark's original schedule).

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
    burstable = [name for name in shard_names(scale) if name not in (KILLED, HUNG, FLAPPING)]
    for _ in range(max(3, int(d / 2))):
        at, shard = round(rng.uniform(0.05 * d, 0.85 * d), 3), rng.choice(burstable)
        hold = round(rng.uniform(0.02 * d, 0.06 * d), 3)
        faults.append(Fault(kind=FaultKind.ERROR_BURST_5XX, target=shard, at_seconds=at, hold_seconds=hold, status=503))
    return FaultSchedule.of(faults, seed=seed)


def slow_shard(scale: Scale, seed: int) -> FaultSchedule:
    """One seeded shard answers 10x slower (+9x the generation time) for most of the run; it never fails."""
    target = random.Random(seed).choice(shard_names(scale))
    d = scale.duration
    slow = Fault(
        kind=FaultKind.SHARD_SLOW, target=target, at_seconds=0.0, hold_seconds=0.9 * d, slow_seconds=9 * scale.latency
    )
    return FaultSchedule.of([slow], seed=seed)


def rolling_restart(scale: Scale, seed: int) -> FaultSchedule:
    """A rolling restart from a seeded moment: every shard in turn SIGTERMed (it drains what it has in flight), down
    for a tenth of the run, started again on the same port and healthy before the next one is stopped."""
    at = round(random.Random(seed).uniform(0.05, 0.2) * scale.duration, 3)
    down = 0.1 * scale.duration
    rolling = Fault(kind=FaultKind.SHARD_TERMINATE, target=FLEET_TARGET, at_seconds=at, hold_seconds=down)
    return FaultSchedule.of([rolling], seed=seed)


def gray(scale: Scale, seed: int) -> FaultSchedule:
    """Two seeded shards turn gray for most of the run: half their answers are 200s whose body is not a completion
    (each shard its own seeded kind: cut-off JSON, ``choices: []``, an error object, or nothing), health 200."""
    rng = random.Random(seed)
    d = scale.duration
    faults = [
        Fault(kind=FaultKind.GRAY_200, target=name, at_seconds=round(rng.uniform(0.05, 0.2) * d, 3),
              hold_seconds=0.7 * d, rate=0.5, body=rng.choice(("truncated", "no_choices", "error_object", "empty")))
        for name in rng.sample(shard_names(scale), 2)
    ]  # fmt: skip
    return FaultSchedule.of(faults, seed=seed)


def backpressure(scale: Scale, seed: int) -> FaultSchedule:
    """Every shard caps its concurrency (seeded, 2/3 to all of an even share): together below the offered load,
    so the fleet answers 429 with ``Retry-After: 1`` for the run's duration."""
    rng = random.Random(seed)
    share = max(2, scale.concurrency // scale.shards)
    faults = [
        Fault(kind=FaultKind.CONCURRENCY_CAP, target=name, at_seconds=0.0, hold_seconds=scale.duration,
              count=rng.randint(max(1, 2 * share // 3), share - 1))
        for name in shard_names(scale)
    ]  # fmt: skip
    return FaultSchedule.of(faults, seed=seed)


def stream_freeze(scale: Scale, seed: int) -> FaultSchedule:
    """Two seeded shards SIGSTOPped while they stream (each for a quarter of the run), at seeded times."""
    rng = random.Random(seed)
    d = scale.duration
    faults = [
        Fault(kind=FaultKind.SHARD_HANG, target=name, at_seconds=round(rng.uniform(0.15, 0.55) * d, 3),
              hold_seconds=0.25 * d)
        for name in rng.sample(shard_names(scale), 2)
    ]  # fmt: skip
    return FaultSchedule.of(faults, seed=seed)


def fleet_outage(scale: Scale, seed: int) -> FaultSchedule:
    """Every shard SIGKILLed at once (a node or network loss), all restarted a fifth of the run later, at a seeded
    moment: does anything survive a moment with no shard at all?"""
    d = scale.duration
    at = round(random.Random(seed).uniform(0.25, 0.45) * d, 3)
    outage = Fault(kind=FaultKind.ALL_SHARDS_DOWN, target=FLEET_TARGET, at_seconds=at, hold_seconds=0.2 * d)
    return FaultSchedule.of([outage], seed=seed)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("chaos", "SIGKILL one shard, SIGSTOP one, one flapping, 503 bursts on the others", "lost", "wasted",
                 "how many prompts does it lose?", chaos, hit="errors"),
        Scenario("slow-shard", "one shard 10x slower, never failing", "late", "p99",
                 "how many prompts does the slow shard make late?", slow_shard, hit="slowed"),
        Scenario("rolling-restart", "SIGTERM one shard at a time, each healthy again before the next", "errors", "p99",
                 "does the client see a planned restart?", rolling_restart),
        Scenario("gray", "two shards answer 200 with malformed or empty bodies half the time", "corrupt", "errors",
                 "does junk reach the client as a completion?", gray, hit="malformed", sim_only=True),
        Scenario("backpressure", "every shard caps its concurrency, 429 + Retry-After beyond", "goodput", "wasted",
                 "how much of the fault-free rate does it keep?", backpressure, hit="refused", sim_only=True),
        Scenario("stream-freeze", "long streamed generations, two shards SIGSTOPped mid-stream", "lost", "late",
                 "does a frozen stream cost the prompt, and how many end more than 1 s late?", stream_freeze,
                 stream_tokens=16),
        Scenario("fleet-outage", "every shard SIGKILLed at once, restarted a moment later", "lost", "p99",
                 "does it ride out a moment with no shard?", fleet_outage),
    )
}  # fmt: skip
"""The matrix, in the order it runs and is reported."""


def baseline(scenario: Scenario) -> Scenario:
    """The same scenario without faults: the run its goodput is measured against."""
    return Scenario(
        f"{scenario.name} (fault-free)", "no faults", scenario.figure, scenario.tiebreak, "", no_faults,
        stream_tokens=scenario.stream_tokens,
    )  # fmt: skip


def rank_key(scenario: Scenario, row: dict[str, float]) -> tuple[float, float, float]:
    """Sort key of a contender's figures in ``scenario`` (smaller is better; a figure that is n/a ranks last): its
    figure, its tiebreak, then p99, so that equals on both (or a tiebreak n/a for everyone, as ``wasted`` is on real
    vLLM) are never ordered by the order contenders are listed in."""

    def signed(column: Column) -> float:
        if math.isnan(row[column]):
            return math.inf
        return -row[column] if column in HIGHER_IS_BETTER else row[column]

    return signed(scenario.figure), signed(scenario.tiebreak), signed("p99")


REAL_KINDS: Final[frozenset[FaultKind]] = frozenset(
    {FaultKind.SHARD_KILL, FaultKind.SHARD_HANG, FaultKind.SHARD_TERMINATE, FaultKind.ALL_SHARDS_DOWN}
)
"""The faults a real server takes (:class:`~rollout_runtime.vllm.fleet.VllmFleet`: signals to its processes); the
others are the sim shard's injected answers, which it refuses."""


def on_real_shards(scenario: Scenario, scale: Scale) -> tuple[Scenario | None, str]:
    """The scenario as real servers can run it and what was left out of it; None (and why) when nothing is left.

    Faults of kinds a real server cannot take, or on shards the scale does not have, are dropped; the proof a
    fault hit is then the injector's record (``faults_applied``), since real servers count no injected faults.
    """
    if scenario.sim_only:
        return None, f"sim-only: a real server cannot be made to show it ({scenario.summary})"
    names = set(shard_names(scale)) | {FLEET_TARGET}
    sample = scenario.schedule(scale, 1).faults
    dropped = sorted({f.kind.value for f in sample if f.kind not in REAL_KINDS or f.target not in names})
    if not any(f.kind in REAL_KINDS and f.target in names for f in sample):
        return None, f"no fault a real server takes ({', '.join(dropped)} are the sim's)"

    def schedule(scale: Scale, seed: int) -> FaultSchedule:
        faults = [f for f in scenario.schedule(scale, seed).faults if f.kind in REAL_KINDS and f.target in names]
        return FaultSchedule.of(faults, seed=seed)

    note = f"without {', '.join(dropped)} (sim-only or on shards it lacks)" if dropped else ""
    return dataclasses.replace(scenario, schedule=schedule, hit="faults_applied"), note
