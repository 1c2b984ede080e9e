"""The chaos scenario runner: a real fleet, a real dispatcher, a seeded fault schedule, and the invariants after.

One scenario = simulated generation shards (``SimFleet``, real subprocesses) + two simulated environment servers
(``rollout-fleet sim-env``: the arithmetic verifier, and the checkpointed multi-step environment) + the runtime's
``Dispatcher`` following a ``LocalShardSource`` (its own probes), driving N prompts through generation and an
environment episode each, while a :class:`~rollout_runtime.sim.chaos.FaultInjector` applies the schedule.

Every attempt the rollout function makes is recorded (its id, shard, stage, how it ended) and every dispatcher event
is stamped with loop time. :func:`check_invariants` then states what must hold whatever the faults did, and
:func:`summarize` charges each failed attempt to the fault that caused it (same target, inside its window) to say
what each fault cost. The JSON summary goes to ``$CHAOS_REPORT_DIR`` (default ``reports/chaos``), from which
``scripts/reliability_report.py`` fills docs/reliability.md.

Plain helpers (no fixtures): the tests in tests/chaos import them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry

from rollout_runtime.dispatch import (
    AttemptEnded,
    Completed,
    DataFailed,
    Dispatcher,
    DispatchEvent,
    DispatchPolicy,
    FailureLedger,
    Outcome,
    ShardEjected,
    Skipped,
)
from rollout_runtime.environment import EnvironmentClient
from rollout_runtime.failures import RolloutRedispatchExhausted, RolloutStall, failure_type
from rollout_runtime.generation import GenerationClient
from rollout_runtime.health import ProbeSettings
from rollout_runtime.metrics import FLEET_LABELS
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim import SimFleet, expected_answer
from rollout_runtime.sim.chaos import FLEET_TARGET, FaultInjector, FaultKind, FaultSchedule, InjectedFault, SimEnvTarget
from rollout_runtime.sim.environments import (
    ArithmeticRequest,
    ArithmeticResponse,
    MultiStepRequest,
    MultiStepResponse,
)
from support.tools import REPO_ROOT

MODEL = "sim-model"
MAX_MODEL_LEN = 256
MAX_TOKENS = 16
MULTISTEP_ENV = "multistep"
"""The environment target the ENV_CRASH faults hit (it checkpoints; the verifier is restart-only)."""
ATTRIBUTION_GRACE_SECONDS = 1.0
"""A failed attempt that ends this long after a fault ended is still charged to it (probes, retries in flight)."""

PromptKind = Literal["verify", "multistep", "over_long", "bad_problem"]


def report_dir() -> Path:
    return Path(os.environ.get("CHAOS_REPORT_DIR", REPO_ROOT / "reports" / "chaos"))


@dataclass(frozen=True, slots=True)
class ChaosPrompt:
    id: int
    kind: PromptKind
    text: str
    problem: str
    values: tuple[int, ...] = ()


def chaos_prompts(count: int, seed: int) -> list[ChaosPrompt]:
    """A seeded mix: ~80 % verified arithmetic, ~17 % multi-step episodes, ~2 % over-long, ~1 % unparseable."""
    rng = random.Random(seed)
    prompts: list[ChaosPrompt] = []
    for index in range(count):
        draw = rng.random()
        a, b, op = rng.randint(1, 999), rng.randint(1, 999), rng.choice("+-*")
        problem = f"{a} {op} {b}"
        if draw < 0.02:
            padding = " ".join(["context"] * (MAX_MODEL_LEN + 20))
            prompts.append(ChaosPrompt(index, "over_long", f"{padding} What is {problem}?", problem))
        elif draw < 0.03:
            prompts.append(ChaosPrompt(index, "bad_problem", f"What is {a} / {b}?", f"{a} / {b}"))
        elif draw < 0.20:
            values = tuple(rng.randint(-50, 50) for _ in range(rng.randint(3, 5)))
            prompts.append(ChaosPrompt(index, "multistep", f"What is {problem}?", problem, values))
        else:
            prompts.append(ChaosPrompt(index, "verify", f"What is {problem}? Answer with a number.", problem))
    return prompts


@dataclass(slots=True)
class AttemptRecord:
    """One call of the rollout function, as the rollout itself saw it end."""

    attempt_id: int
    prompt_id: int
    shard: str
    started: float
    stage: str = "generate"
    ended: float | None = None
    ok: bool = False
    error_type: str | None = None


@dataclass(frozen=True, slots=True)
class ChaosResult:
    attempt_id: int
    text: str
    reward: float | None
    totals: tuple[int, ...] = ()
    continued_from_step: int | None = None


@dataclass
class ScenarioConfig:
    name: str
    seed: int
    prompts: int
    schedule: FaultSchedule
    shards: int = 4
    concurrency: int = 32
    step_delay_seconds: float = 0.02
    hold_at_progress: float = 0.85
    """Once this fraction of the prompts has finished, new attempts wait until every scheduled fault has been
    applied, so a fast run cannot outrun its schedule (faults on one target are serialised and may start late).
    Every fault must trigger earlier; applying a triggered fault takes only time, so this cannot deadlock."""
    policy: dict[str, Any] = field(default_factory=dict)
    probe: ProbeSettings = field(
        default_factory=lambda: ProbeSettings(
            period_seconds=0.5, timeout_seconds=0.4, failure_threshold=2, success_threshold=2, check_model=True
        )
    )


def chaos_policy(ledger: Path, **overrides: Any) -> DispatchPolicy:
    """Budgets sized so that the schedules' faults are survivable (fast backoff, short ejections), stalls abort."""
    fields: dict[str, Any] = {
        "max_infra_attempts": 12,
        "max_data_attempts": 2,
        "backoff_initial_seconds": 0.05,
        "backoff_max_seconds": 1.0,
        "attempt_timeout_seconds": 20.0,
        "healthy_wait_seconds": 30.0,
        "ejection_base_seconds": 0.5,
        "ejection_max_seconds": 5.0,
        "stall_deadline_seconds": 60.0,
        "stall_check_seconds": 2.0,
        "stall_action": "abort",
        "failure_ledger_path": ledger,
        # Data-failed prompts are reported and the run goes on (the drop rules have their own tests); an
        # infra-exhausted prompt still ends the run.
        "max_skipped_prompts": 1_000_000,
        "min_step_batch_fraction": 0.01,
    }
    return DispatchPolicy(**(fields | overrides))


@dataclass
class ScenarioResult:
    config: ScenarioConfig
    prompts: list[ChaosPrompt]
    outcomes: list[Outcome[ChaosPrompt, ChaosResult]]
    delivered_at: dict[int, float]
    aborted: list[int]
    error: BaseException | None
    attempts: list[AttemptRecord]
    events: list[tuple[float, DispatchEvent]]
    injected: list[InjectedFault]
    injector_errors: list[str]
    metrics: dict[str, float]
    ledger: list[dict[str, Any]]
    stats: dict[str, int]
    leaked_tasks: list[str]
    leaked_sockets: int
    seconds: float


def _socket_count() -> int:
    """Open sockets of this process (every TCP connection is one), from /proc."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
    return count


def _metric_values(registry: CollectorRegistry) -> dict[str, float]:
    """Samples by name and labels; the run's own identity labels (every sample has the same) are left out."""
    values: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_created") or "_bucket" in sample.name:
                continue
            own = sorted((k, v) for k, v in sample.labels.items() if k not in FLEET_LABELS)
            labels = ",".join(f"{k}={v}" for k, v in own)
            values[f"{sample.name}{{{labels}}}"] = sample.value
    return values


async def run_scenario(config: ScenarioConfig, workdir: Path) -> ScenarioResult:
    """Run one scenario end to end; return everything the invariants and the report need. Never raises for the
    run's own terminal errors (RolloutRedispatchExhausted, RolloutStall): they are part of the result."""
    loop = asyncio.get_running_loop()
    baseline_tasks = set(asyncio.all_tasks())
    baseline_sockets = _socket_count()
    started = time.monotonic()
    prompts = chaos_prompts(config.prompts, config.seed)
    ledger_path = workdir / f"{config.name}-ledger.jsonl"
    ledger_path.unlink(missing_ok=True)
    registry = CollectorRegistry()
    attempts: list[AttemptRecord] = []
    events: list[tuple[float, DispatchEvent]] = []
    outcomes: list[Outcome[ChaosPrompt, ChaosResult]] = []
    delivered_at: dict[int, float] = {}
    error: BaseException | None = None
    aborted: list[int] = []
    ids = itertools.count()
    checkpoints = workdir / f"{config.name}-checkpoints"

    async with contextlib.AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(
            SimFleet(config.shards, model=MODEL, max_model_len=MAX_MODEL_LEN, seed=config.seed)
        )
        verifier = await stack.enter_async_context(SimEnvTarget("verifier", name="verifier"))
        multistep = await stack.enter_async_context(
            SimEnvTarget("multistep", checkpoint_dir=checkpoints, name=MULTISTEP_ENV)
        )
        generation = await stack.enter_async_context(GenerationClient(timeout_seconds=30.0, max_connections=128))
        verify_env = await stack.enter_async_context(EnvironmentClient(verifier.url, timeout_seconds=30.0))
        multistep_env = await stack.enter_async_context(EnvironmentClient(multistep.url, timeout_seconds=30.0))

        hold_at = len(prompts) * config.hold_at_progress
        if any(fault.at_progress >= config.hold_at_progress for fault in config.schedule.faults):
            raise ValueError(f"every fault must trigger before {config.hold_at_progress:.0%} progress")
        faults_applied = asyncio.Event()

        async def rollout(shard: Shard, prompt: ChaosPrompt) -> ChaosResult:
            record = AttemptRecord(next(ids), prompt.id, shard.name, loop.time())
            attempts.append(record)
            try:
                if not faults_applied.is_set() and len(outcomes) >= hold_at:
                    await faults_applied.wait()
                completion = await generation.complete(shard, prompt.text, max_tokens=MAX_TOKENS)
                record.stage = "environment"
                episode_id = f"s{config.seed}-p{prompt.id}"
                if prompt.kind == "multistep":
                    reply = await multistep_env.run_episode(
                        MultiStepRequest(
                            episode_id=episode_id,
                            values=list(prompt.values),
                            step_delay_seconds=config.step_delay_seconds,
                        ),
                        MultiStepResponse,
                    )
                    result = ChaosResult(
                        record.attempt_id, completion.text, reply.reward, tuple(reply.totals), reply.continued_from_step
                    )
                else:
                    answer = await verify_env.run_episode(
                        ArithmeticRequest(episode_id=episode_id, problem=prompt.problem, answer=completion.text),
                        ArithmeticResponse,
                    )
                    result = ChaosResult(record.attempt_id, completion.text, answer.reward)
            except BaseException as exc:
                record.ended, record.error_type = loop.time(), failure_type(exc)
                raise
            record.ended, record.ok = loop.time(), True
            return result

        def observe(event: DispatchEvent) -> None:
            events.append((loop.time(), event))

        source = LocalShardSource(fleet.shards, config.probe)
        policy = chaos_policy(ledger_path, max_concurrency=config.concurrency, **config.policy)
        dispatcher = await stack.enter_async_context(
            Dispatcher(source, policy, registry=registry, observer=observe, seed=config.seed)
        )
        injector = FaultInjector(fleet, config.schedule, environments={MULTISTEP_ENV: multistep})
        run = dispatcher.run(prompts, rollout, prompt_ids=[p.id for p in prompts])

        async def release_tail() -> None:
            await injector.until_applied(len(config.schedule.faults))
            faults_applied.set()

        releaser = asyncio.create_task(release_tail(), name="chaos-release-tail")
        try:
            async with run:
                injector.advance(0.0)
                async for outcome in run:
                    outcomes.append(outcome)
                    delivered_at[int(outcome.prompt_id)] = loop.time()
                    injector.advance(len(outcomes) / len(prompts))
        except (RolloutRedispatchExhausted, RolloutStall) as exc:
            error = exc
        finally:
            releaser.cancel()
            await asyncio.gather(releaser, return_exceptions=True)
            await injector.close()
        aborted = [int(i) for i in run.aborted_ids()]
        stats = {
            name: getattr(run.stats, name)
            for name in (
                "submitted", "completed", "data_failed", "skipped", "aborted", "successes", "infra_failures",
                "data_failures", "cancelled", "redispatches", "exhausted", "ejections", "stalls", "in_flight",
            )
        }  # fmt: skip
    # Everything the scenario started is closed now: the dispatcher, clients, environment servers and shards.
    leaked: set[asyncio.Task[Any]] = set()
    sockets = _socket_count()
    for _ in range(200):  # closed transports release their sockets on the next loop iterations
        leaked = {t for t in asyncio.all_tasks() if t not in baseline_tasks and not t.done()}
        sockets = _socket_count()
        if not leaked and sockets <= baseline_sockets:
            break
        await asyncio.sleep(0)
    return ScenarioResult(
        config=config,
        prompts=prompts,
        outcomes=outcomes,
        delivered_at=delivered_at,
        aborted=aborted,
        error=error,
        attempts=attempts,
        events=events,
        injected=list(injector.injected),
        injector_errors=list(injector.errors),
        metrics=_metric_values(registry),
        ledger=FailureLedger.read(ledger_path) if ledger_path.exists() else [],
        stats=stats,
        leaked_tasks=sorted(t.get_name() for t in leaked),
        leaked_sockets=max(0, sockets - baseline_sockets),
        seconds=time.monotonic() - started,
    )


# -- invariants ------------------------------------------------------------------------------------------------


def _metric(scenario: ScenarioResult, name: str, **labels: str) -> float:
    key = f"{name}{{{','.join(f'{k}={v}' for k, v in sorted(labels.items()))}}}"
    return scenario.metrics.get(key, 0.0)


def _outcome_kinds(result: ScenarioResult) -> Counter[str]:
    """Outcomes by type name: Completed, DataFailed, Skipped."""
    return Counter(type(o).__name__ for o in result.outcomes)


def _attempt_outcomes(result: ScenarioResult) -> Counter[str]:
    """Attempts by outcome, as the dispatcher's AttemptEnded events report them."""
    return Counter(e.outcome for _, e in result.events if isinstance(e, AttemptEnded))


def check_invariants(result: ScenarioResult) -> list[str]:
    """Everything that must hold after a scenario, whatever the faults did; the violations (empty: all hold)."""
    problems: list[str] = []
    prompts = {p.id: p for p in result.prompts}
    delivered = [int(o.prompt_id) for o in result.outcomes]
    counts = Counter(delivered)

    # 1. Each prompt ends exactly once, or the run raised loudly and says which prompts it aborted.
    twice = [pid for pid, n in counts.items() if n > 1]
    if twice:
        problems.append(f"prompts delivered more than once: {twice[:10]}")
    if set(delivered) & set(result.aborted):
        problems.append("prompts both delivered and aborted")
    lost = set(prompts) - set(delivered) - set(result.aborted)
    if lost:
        problems.append(f"{len(lost)} prompt(s) lost: {sorted(lost)[:10]}")
    if result.aborted and not isinstance(result.error, RolloutRedispatchExhausted | RolloutStall):
        problems.append(f"{len(result.aborted)} prompt(s) aborted without a run-terminal error: {result.error!r}")
    if result.error is not None and not result.aborted and len(set(delivered)) != len(prompts):
        problems.append("the run raised but accounts for no aborted prompts")

    # 2. Completed results come from the one successful attempt of their prompt, and are right.
    by_prompt: dict[int, list[AttemptRecord]] = defaultdict(list)
    for attempt in result.attempts:
        by_prompt[attempt.prompt_id].append(attempt)
    by_id = {a.attempt_id: a for a in result.attempts}
    for outcome in result.outcomes:
        pid = int(outcome.prompt_id)
        ok = [a for a in by_prompt[pid] if a.ok]
        if isinstance(outcome, Completed):
            res: ChaosResult = outcome.result
            attempt = by_id.get(res.attempt_id)
            if attempt is None or not attempt.ok or attempt.prompt_id != pid:
                problems.append(f"prompt {pid}: completed with a result from a failed or foreign attempt {attempt}")
            if len(ok) != 1:
                problems.append(f"prompt {pid}: {len(ok)} successful attempts for one completion")
            prompt = prompts[pid]
            if prompt.kind in ("over_long", "bad_problem"):
                problems.append(f"prompt {pid} ({prompt.kind}) completed but can never succeed")
            elif prompt.kind == "verify" and (res.reward != 1.0 or res.text != expected_answer(prompt.text)):
                problems.append(f"prompt {pid}: wrong completion {res.text!r} (reward {res.reward})")
            elif prompt.kind == "multistep":
                expected = tuple(itertools.accumulate(prompt.values))
                if res.reward != 1.0 or res.totals != expected:
                    problems.append(f"prompt {pid}: multistep totals {res.totals} != {expected}")
        else:
            if ok:
                problems.append(f"prompt {pid}: {type(outcome).__name__} although attempt {ok[0].attempt_id} succeeded")
            if not outcome.reason:
                problems.append(f"prompt {pid}: {type(outcome).__name__} without a reason")
    for attempt in result.attempts:
        if attempt.ended is None:
            problems.append(f"attempt {attempt.attempt_id} never ended")

    # 3. Metrics equal the ledger, the outcomes and the events.
    kinds = _outcome_kinds(result)
    for label, kind in (("completed", "Completed"), ("data_failed", "DataFailed"), ("skipped", "Skipped")):
        if _metric(result, "rollout_prompts_total", result=label) != kinds[kind]:
            problems.append(f"rollout_prompts_total{{{label}}} != {kinds[kind]} outcomes")
    ledger = Counter(entry["result"] for entry in result.ledger)
    if ledger["data_failed"] != kinds["DataFailed"] or ledger["skipped"] != kinds["Skipped"]:
        problems.append(f"ledger {dict(ledger)} != outcomes {dict(kinds)}")
    ledger_ids = sorted(int(e["prompt_id"]) for e in result.ledger)
    failed_ids = sorted(int(o.prompt_id) for o in result.outcomes if not isinstance(o, Completed))
    if ledger_ids != failed_ids:
        problems.append("ledger prompt ids differ from the data-failed/skipped outcomes")
    ended = _attempt_outcomes(result)
    with_shard = sum(1 for _, e in result.events if isinstance(e, AttemptEnded) and e.shard is not None)
    # A run that raises cancels its attempts in flight: no AttemptEnded is emitted for them. The dispatcher counts
    # those it cancels itself as cancelled, but not those a shard eviction ended after the run had raised (reported
    # to the dispatch owner), so with a run error the metric lies between the events and events + cut-short calls.
    cut_short = len(result.attempts) - with_shard
    cancelled_calls = sum(1 for a in result.attempts if a.error_type == "CancelledError")  # evicted or cut short
    if cut_short < 0 or (result.error is None and cut_short):
        problems.append(f"{with_shard} attempt events on shards, but {len(result.attempts)} rollout calls")
    if cut_short > cancelled_calls - ended["cancelled"]:
        problems.append(f"{cut_short} attempts without an event, but only {cancelled_calls} cancelled rollout calls")
    for outcome_label in ("success", "infra_failure", "data_failure", "cancelled"):
        value = _metric(result, "rollout_attempts_total", outcome=outcome_label)
        low = ended[outcome_label]
        high = low + (cut_short if outcome_label == "cancelled" else 0)
        if not low <= value <= high:
            problems.append(f"rollout_attempts_total{{{outcome_label}}} = {value}, expected {low}..{high}")
    if ended["success"] != sum(1 for a in result.attempts if a.ok):
        problems.append("successful attempt events differ from successful rollout calls")
    failures = sum(v for k, v in result.metrics.items() if k.startswith("rollout_failures_total{"))
    if failures != ended["infra_failure"] + ended["data_failure"]:
        problems.append("rollout_failures_total != failed attempts")
    redispatches = _metric(result, "rollout_redispatches_total")
    if redispatches != result.stats["redispatches"]:
        problems.append("rollout_redispatches_total != the run's redispatch count")
    final_failures = kinds["DataFailed"] + result.stats["exhausted"]  # skipped prompts are among the exhausted
    if result.error is None and redispatches != sum(ended.values()) - ended["success"] - final_failures:
        problems.append("every failed attempt is either redispatched or final: the counts disagree")
    ejections = sum(1 for _, e in result.events if isinstance(e, ShardEjected))
    if sum(v for k, v in result.metrics.items() if k.startswith("rollout_ejections_total{")) != ejections:
        problems.append("rollout_ejections_total != ejection events")
    if _metric(result, "rollout_in_flight") != 0 or result.stats["in_flight"] != 0:
        problems.append("attempts still in flight after the run")

    # 4. Nothing leaked.
    if result.leaked_tasks:
        problems.append(f"tasks leaked: {result.leaked_tasks[:10]}")
    if result.leaked_sockets:
        problems.append(f"{result.leaked_sockets} socket(s) leaked")
    if result.injector_errors:
        problems.append(f"faults that could not be applied: {result.injector_errors}")
    return problems


# -- costs and the report -------------------------------------------------------------------------------------


def _charge(time_: float, event: AttemptEnded, injected: Sequence[InjectedFault]) -> InjectedFault | None:
    """The fault that caused a failed attempt: same target, inside its window (plus grace)."""
    for fault in injected:
        if not fault.covers(time_, ATTRIBUTION_GRACE_SECONDS):
            continue
        kind = fault.fault.kind
        if event.failure_type == "GymTransportError":
            if kind is FaultKind.ENV_CRASH:
                return fault
            continue
        if kind is FaultKind.ENV_CRASH:
            continue
        if fault.fault.target == FLEET_TARGET or event.shard == fault.fault.target or event.shard is None:
            return fault
    return None


def summarize(result: ScenarioResult, problems: Sequence[str]) -> dict[str, Any]:
    """The scenario's JSON summary: counts, faults by kind, and what each kind of fault cost."""
    failed: list[tuple[float, AttemptEnded]] = [
        (t, e) for t, e in result.events if isinstance(e, AttemptEnded) and e.outcome != "success"
    ]
    per_prompt: dict[int, list[tuple[float, AttemptEnded]]] = defaultdict(list)
    for t, e in result.events:
        if isinstance(e, AttemptEnded):
            per_prompt[int(e.prompt_id)].append((t, e))
    first_start: dict[int, float] = {}
    for attempt in result.attempts:
        first_start.setdefault(attempt.prompt_id, attempt.started)
    latency = {pid: result.delivered_at[pid] - first_start[pid] for pid in result.delivered_at if pid in first_start}
    charged: dict[str, Counter[str]] = defaultdict(Counter)
    affected: dict[str, set[int]] = defaultdict(set)
    unattributed: Counter[str] = Counter()
    for t, event in failed:
        pid = int(event.prompt_id)
        fault = _charge(t, event, result.injected) if event.outcome != "data_failure" else None
        last = per_prompt[pid][-1][1] is event
        if event.outcome == "data_failure":
            key = "data"  # the prompt's own failure (over-long, unparseable): no fault is charged for it
        else:
            key = fault.fault.kind.value if fault is not None else "unattributed"
        charged[key]["failed_attempts"] += 1
        charged[key]["attempt_milliseconds"] += round(event.seconds * 1000)
        charged[key][f"outcome_{event.outcome}"] += 1
        if not last:
            charged[key]["redispatches"] += 1
        affected[key].add(pid)
        if key == "unattributed":
            unattributed[f"{event.failure_type or event.outcome}"] += 1
    clean = [latency[pid] for pid in latency if len(per_prompt[pid]) == 1]
    clean_mean = statistics.fmean(clean) if clean else 0.0
    costs: dict[str, dict[str, Any]] = {}
    for key, counter in sorted(charged.items()):
        hit = [latency[pid] for pid in affected[key] if pid in latency]
        costs[key] = {
            "failed_attempts": counter["failed_attempts"],
            "redispatches": counter["redispatches"],
            "by_outcome": {k.removeprefix("outcome_"): v for k, v in counter.items() if k.startswith("outcome_")},
            "affected_prompts": len(affected[key]),
            # Time the failed attempts ran before failing (what the fault costs an attempt, queueing aside).
            "failed_attempt_mean_seconds": round(
                counter["attempt_milliseconds"] / counter["failed_attempts"] / 1000, 3
            ),
            # End-to-end: a redispatched prompt re-enters the ready queue behind the backlog, so this includes
            # waiting for the prompts queued before it, not only the fault itself.
            "extra_latency_mean_seconds": round(statistics.fmean(hit) - clean_mean, 3) if hit else None,
        }
    kinds = _outcome_kinds(result)
    continued = [
        int(o.prompt_id)
        for o in result.outcomes
        if isinstance(o, Completed) and o.result.continued_from_step is not None
    ]
    checkpointed = sorted({e for f in result.injected for e in f.detail.get("checkpointed_episodes", [])})
    all_latencies = sorted(latency.values())
    return {
        "scenario": result.config.name,
        "seed": result.config.seed,
        "shards": result.config.shards,
        "concurrency": result.config.concurrency,
        "prompts": len(result.prompts),
        "prompt_kinds": dict(Counter(p.kind for p in result.prompts)),
        "completed": kinds["Completed"],
        "data_failed": kinds["DataFailed"],
        "skipped": kinds["Skipped"],
        "aborted": len(result.aborted),
        "lost": len(
            set(p.id for p in result.prompts) - {int(o.prompt_id) for o in result.outcomes} - set(result.aborted)
        ),
        "run_error": None if result.error is None else f"{type(result.error).__name__}: {str(result.error)[:300]}",
        "faults_scheduled": dict(result.config.schedule.kinds()),
        "faults_injected": dict(Counter(f.fault.kind.value for f in result.injected)),
        "faults": [f.to_json() for f in result.injected],
        "attempts": dict(_attempt_outcomes(result)),
        "failure_types": dict(Counter(e.failure_type for _, e in failed if e.failure_type)),
        "ejections": sum(1 for _, e in result.events if isinstance(e, ShardEjected)),
        "redispatches": result.stats["redispatches"],
        "fault_costs": costs,
        "unattributed_failures": dict(unattributed),
        "checkpointed_episodes": len(checkpointed),
        "resumed_from_checkpoint": len(continued),
        "data_failure_reasons": sorted(
            {o.reason[:120] for o in result.outcomes if isinstance(o, DataFailed | Skipped)}
        )[:5],
        "latency_seconds": {
            "clean_mean": round(clean_mean, 3),
            "p50": round(all_latencies[len(all_latencies) // 2], 3) if all_latencies else None,
            "p99": round(all_latencies[int(len(all_latencies) * 0.99)], 3) if all_latencies else None,
        },
        "leaked_tasks": len(result.leaked_tasks),
        "leaked_sockets": result.leaked_sockets,
        "invariant_violations": list(problems),
        "seconds": round(result.seconds, 1),
    }


def write_report(summary: dict[str, Any], directory: Path | None = None) -> Path:
    directory = directory or report_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{summary['scenario']}.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path


def write_tally(name: str, tally: Counter[str]) -> None:
    """Record how many cases a fuzz or bad-input module really ran (for docs/reliability.md)."""
    if not tally:
        return
    directory = report_dir()
    directory.mkdir(parents=True, exist_ok=True)
    summary = {"scenario": name, "cases": sum(tally.values()), "by_test": dict(sorted(tally.items()))}
    (directory / f"{name}.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
