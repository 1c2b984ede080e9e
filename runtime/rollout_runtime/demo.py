"""The local demo fleet: real simulated shards and two environment servers, a chaos schedule, one batch of prompts.

Everything runs on 127.0.0.1 as real subprocesses; nothing needs Kubernetes. The shards are simulated by default,
or real vLLM servers (``--shards vllm``; what differs is in :mod:`rollout_runtime.demo_shards`). The demo is the
project's main job:
it shows, in under half a minute, a batch surviving a killed shard, a hung shard, a flapping shard and 503
bursts, and an environment server SIGKILLed halfway (its episodes move to the other one, through an
:class:`~rollout_runtime.environment.pool.EnvironmentPool`), with over-long prompts reported as data failures
(with vLLM's reason) instead of zero rewards.

This module holds the run; :mod:`rollout_runtime.cli.demo` renders it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import aiohttp
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field

from rollout_runtime.demo_shards import MAX_MODEL_LEN, ShardEngine, demo_shards
from rollout_runtime.dispatch import (
    Completed,
    DataFailed,
    Dispatcher,
    DispatchEvent,
    DispatchPolicy,
    FailureLedger,
    HealthyShardsChanged,
    RunStats,
    ShardEjected,
    ShardQuarantined,
    ShardRestored,
    Skipped,
    StallDetected,
)
from rollout_runtime.environment.pool import EnvironmentPool
from rollout_runtime.failures import RolloutRedispatchExhausted, RolloutStall
from rollout_runtime.generation import GenerationClient
from rollout_runtime.health import HealthPhase, ProbeSettings, ProbeTargetPolicy, Transition
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim.chaos import FaultInjector, FaultKind, FaultSchedule, InjectedFault
from rollout_runtime.sim.env_process import SimEnvProcess, spawn_env_server
from rollout_runtime.sim.environments import ArithmeticRequest, ArithmeticResponse
from rollout_runtime.weights import StaleRefitter

__all__ = [
    "DemoConfig",
    "DemoPrompt",
    "DemoReport",
    "DemoResult",
    "DemoView",
    "demo_prompts",
    "run_demo",
]

MAX_TOKENS = 16
WEIGHTS_VERSION = 1
"""The policy version the demo's trainer publishes and refits every shard to (a restart comes back Stale)."""


class DemoConfig(BaseModel):
    """What the demo runs. The defaults finish in well under 30 s on two cores."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shards: Annotated[int, Field(ge=1, le=32)] = 5
    engine: ShardEngine = ShardEngine.SIM
    """Simulated shards, or real vLLM servers (``scripts/install-tools.sh vllm``; ``vllm_tool`` is its directory,
    ``$ROLLOUT_FLEET_VLLM_TOOL`` when unset)."""
    vllm_tool: Path | None = None
    prompts: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    over_long_prompts: Annotated[int, Field(ge=0)] = 5
    chaos: bool = True
    environment: bool = True
    """Score every generation on a real environment server (the arithmetic verifier)."""
    concurrency: Annotated[int, Field(ge=1, le=4096)] = 16
    shard_latency_seconds: Annotated[float, Field(ge=0, le=10)] = 0.15
    """Simulated generation time, so that chaos lands on requests in flight (sim shards only)."""
    seed: int = 0
    report_dir: Path = Path("reports/demo")


@dataclass(frozen=True, slots=True)
class DemoPrompt:
    problem: str
    text: str
    over_long: bool = False


@dataclass(frozen=True, slots=True)
class DemoResult:
    answer: str
    reward: float | None
    """None when no environment scored it (``--no-env``)."""


def demo_prompts(config: DemoConfig) -> list[DemoPrompt]:
    """Arithmetic problems (which the sim model answers and the verifier scores) plus a few over-long ones."""
    rng = random.Random(config.seed)
    prompts: list[DemoPrompt] = []
    for _ in range(config.prompts - min(config.over_long_prompts, config.prompts)):
        a, b, op = rng.randint(1, 99), rng.randint(1, 99), rng.choice("+-*")
        problem = f"{a} {op} {b}"
        prompts.append(DemoPrompt(problem=problem, text=f"What is {problem}? Answer with a number."))
    for _ in range(min(config.over_long_prompts, config.prompts)):
        padding = " ".join(["context"] * (MAX_MODEL_LEN + 50))
        text = f"{padding} What is 1 + 1?"
        prompts.insert(rng.randrange(len(prompts) + 1), DemoPrompt("1 + 1", text, over_long=True))
    return prompts


@dataclass
class DemoReport:
    """The JSON report, and what the summary table shows."""

    config: dict[str, Any]
    stats: dict[str, int] = field(default_factory=dict)
    data_failures: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    chaos: list[dict[str, Any]] = field(default_factory=list)
    failure_types: dict[str, int] = field(default_factory=dict)
    ejections_by_shard: dict[str, int] = field(default_factory=dict)
    environment_servers_killed: list[str] = field(default_factory=list)
    shard_phases: dict[str, str] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)
    mean_reward: float | None = None
    wall_seconds: float = 0.0
    error: str | None = None
    invariant_holds: bool = False
    ledger_path: str | None = None
    weights: dict[str, Any] = field(default_factory=dict)
    """Policy version, committed results by weights version, stale_committed (must be 0), stale attempts, refits."""

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True, default=str)


class DemoView:
    """What a renderer may read while the demo runs (all in-process, updated from the event loop)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.completed = 0
        self.data_failed = 0
        self.skipped = 0
        self.events: list[str] = []
        self.timeline: list[str] = []
        self.phases: dict[str, HealthPhase] = {}
        self.routable: tuple[str, ...] = ()
        self.ejected: frozenset[str] = frozenset()
        self.stats: RunStats | None = None
        self.started = time.monotonic()

    @property
    def finished(self) -> int:
        return self.completed + self.data_failed + self.skipped

    def note(self, text: str) -> None:
        line = f"{time.monotonic() - self.started:5.1f}s  {text}"
        self.timeline.append(line)
        self.events = self.timeline[-8:]


async def run_demo(
    config: DemoConfig,
    *,
    registry: CollectorRegistry,
    view: DemoView | None = None,
    on_tick: Callable[[DemoView], None] | None = None,
) -> DemoReport:
    """Run the demo batch; never raises for a failed run (the report says what happened)."""
    prompts = demo_prompts(config)
    view = view or DemoView(len(prompts))
    report = DemoReport(config=config.model_dump(mode="json"))
    config.report_dir.mkdir(parents=True, exist_ok=True)
    ledger_path = config.report_dir / "failures.jsonl"
    ledger_path.unlink(missing_ok=True)
    report.ledger_path = str(ledger_path)
    started = time.monotonic()
    shards = demo_shards(
        config.engine,
        config.shards,
        seed=config.seed,
        latency_seconds=config.shard_latency_seconds,
        vllm_tool=config.vllm_tool,
        log_dir=config.report_dir / "shard-logs",
    )
    async with contextlib.AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(shards.fleet)
        view.note(f"started {shards.description}")
        envs: list[SimEnvProcess] = []
        if config.environment:
            for index in range(2):  # two servers: the chaos kills one, the pool moves its episodes to the other
                envs.append(await stack.enter_async_context(await spawn_env_server("verifier")))
                view.note(f"started arithmetic verifier env-{index} at {envs[-1].url}")

        def on_transition(name: str, transition: Transition, result: object) -> None:
            if transition.reason == "restart":
                view.note(f"{name} restarted with base weights: Stale until refit")

        source = LocalShardSource(
            fleet.shards,
            shards.probe,
            policy=ProbeTargetPolicy.local(),
            identity=shards.identity,  # a killed shard restarts with base weights: Stale until refit
            on_transition=on_transition,
        )
        policy = DispatchPolicy(
            max_infra_attempts=10,
            max_data_attempts=2,
            backoff_initial_seconds=0.05,
            backoff_max_seconds=1.0,
            attempt_timeout_seconds=5.0,
            healthy_wait_seconds=20.0,
            ejection_base_seconds=2.0,
            ejection_max_seconds=10.0,
            stall_deadline_seconds=25.0,
            stall_check_seconds=1.0,
            stall_action="abort",
            max_concurrency=config.concurrency,
            # The demo's own skip budget (NeMo-RL's names): its deliberately over-long prompts may be reported
            # DataFailed, one more data failure ends the run; no prompt may run out of its infra budget.
            max_skipped_prompts=config.over_long_prompts,
            max_consecutive_dropped_prompts=0,
            min_step_batch_fraction=min(0.9, max(0.01, 1 - config.over_long_prompts / config.prompts)),
        )
        generation = await stack.enter_async_context(GenerationClient(timeout_seconds=30.0))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        weights = source.weights

        async def push_weights(name: str, version: int) -> None:
            await shards.refit(http, fleet.shard(name), version)

        refitter = StaleRefitter(
            weights, push_weights, on_refit=lambda name, v: view.note(f"refit {name} to weights version {v}")
        )
        environment: EnvironmentPool | None = None
        if envs:
            servers = [Shard(name=f"env-{i}", endpoint=e.url) for i, e in enumerate(envs)]
            env_probes = ProbeSettings(period_seconds=0.5, timeout_seconds=0.25, failure_threshold=2)
            env_source = LocalShardSource(servers, env_probes, policy=ProbeTargetPolicy.local())
            env_policy = DispatchPolicy(backoff_initial_seconds=0.05, backoff_max_seconds=0.5, healthy_wait_seconds=20)
            environment = await stack.enter_async_context(EnvironmentPool(env_source, env_policy, seed=config.seed))

        async def rollout(shard: Shard, prompt: DemoPrompt) -> DemoResult:
            completion = await generation.complete(shard, prompt.text, max_tokens=MAX_TOKENS)
            # Restart evidence right after the answer: an answer from a restarted shard is then judged stale.
            await weights.observe(shard.name, await weights.read_identity(shard.name))
            if environment is None:
                return DemoResult(answer=completion.text, reward=None)
            reply = await environment.run_episode(
                ArithmeticRequest(problem=prompt.problem, answer=completion.text), ArithmeticResponse
            )
            return DemoResult(answer=completion.text, reward=reply.reward)

        def observe(event: DispatchEvent) -> None:
            if isinstance(event, ShardEjected):
                view.note(f"ejected {event.shard} for {event.seconds:.1f}s (passive: a request failed)")
            elif isinstance(event, ShardQuarantined):
                view.note(f"quarantined {event.shard}: its {event.signal} is unlike its peers' (p={event.p_value:.1g})")
            elif isinstance(event, ShardRestored):
                view.note(f"restored {event.shard} ({event.reason})")
            elif isinstance(event, HealthyShardsChanged):
                view.routable = event.routable
            elif isinstance(event, StallDetected):
                view.note(f"STALL: nothing committed for {event.idle_seconds:.0f}s")

        dispatcher = await stack.enter_async_context(
            Dispatcher(
                source, policy, registry=registry, observer=observe, seed=config.seed, ledger=FailureLedger(ledger_path)
            )
        )
        await weights.publish(WEIGHTS_VERSION)
        failed_refits = await weights.refit_all(WEIGHTS_VERSION, lambda name: push_weights(name, WEIGHTS_VERSION))
        view.note(
            f"trainer published policy version {WEIGHTS_VERSION}; refit {config.shards - len(failed_refits)} shards"
        )
        schedule = shards.schedule(fleet.names) if config.chaos else FaultSchedule()
        chaos = FaultInjector(fleet, schedule, observer=lambda record: view.note(_chaos_note(record)))
        chaos_clock = asyncio.get_running_loop().time()
        rewards: list[float | None] = []
        failure_types: Counter[str] = Counter()
        run = dispatcher.run(prompts, rollout)
        try:
            async with run:
                async for outcome in run:
                    if isinstance(outcome, Completed):
                        view.completed += 1
                        rewards.append(outcome.result.reward)
                    elif isinstance(outcome, DataFailed):
                        view.data_failed += 1
                        failure_types[outcome.failure_type] += 1
                        report.data_failures.append(_failed_entry(outcome))
                    elif isinstance(outcome, Skipped):
                        view.skipped += 1
                        report.skipped.append({"prompt_id": outcome.prompt_id, "reason": outcome.reason})
                    view.stats = run.stats
                    view.phases = source.phases()
                    view.ejected = dispatcher.ejected
                    chaos.advance(view.finished / max(len(prompts), 1))
                    refitter.kick()
                    if config.chaos and len(envs) > 1 and envs[0].running and view.finished * 2 >= len(prompts):
                        await envs[0].kill()  # halfway: SIGKILL an environment server mid-batch
                        report.environment_servers_killed.append("env-0")
                        view.note("killed environment server env-0 (SIGKILL); its episodes go to env-1")
                    if on_tick is not None:
                        on_tick(view)
        except (RolloutRedispatchExhausted, RolloutStall) as exc:
            report.error = f"{type(exc).__name__}: {exc}"
            view.note(f"run ended: {report.error}")
        finally:
            await chaos.close()
        # Between steps, the trainer refits what came back Stale (the killed shard restarts at base weights).
        if not await refitter.settle(shards.settle_seconds):
            view.note(f"some shards are still down or Stale after {shards.settle_seconds:.0f} s")
        await refitter.aclose()
        report.chaos = [
            {**record.to_json(), "at_seconds": round(record.started - chaos_clock, 2)} for record in chaos.injected
        ]
        stats = run.stats
        view.stats = stats
        view.phases = source.phases()
        report.stats = {
            name: getattr(stats, name)
            for name in (
                "submitted", "completed", "data_failed", "skipped", "aborted", "successes", "infra_failures",
                "data_failures", "cancelled", "stale", "redispatches", "exhausted", "ejections", "stalls",
            )
        }  # fmt: skip
        report.stats["attempts"] = stats.attempts
        report.failure_types = dict(failure_types)
        report.shard_phases = {name: phase.value for name, phase in source.phases().items()}
        report.ejections_by_shard = _ejections_by_shard(registry)
        by_version = {str(v): n for v, n in sorted(stats.committed_by_version.items(), key=lambda kv: str(kv[0]))}
        report.weights = {
            "policy_version": weights.policy_version,
            "committed_by_version": by_version,
            "stale_committed": sum(n for v, n in stats.committed_by_version.items() if v != weights.policy_version),
            "stale_attempts": stats.stale,
            "refits": refitter.refits,
            "failed_refits": refitter.failures + len(failed_refits),
        }
        scored = [r for r in rewards if r is not None]
        report.mean_reward = sum(scored) / len(scored) if scored else None
        report.invariant_holds = stats.submitted == stats.finished + stats.aborted and stats.submitted == len(prompts)
    report.timeline = view.timeline
    report.wall_seconds = round(time.monotonic() - started, 2)
    (config.report_dir / "report.json").write_text(report.to_json())
    return report


def _failed_entry(outcome: DataFailed[DemoPrompt]) -> dict[str, Any]:
    return {
        "prompt_id": outcome.prompt_id,
        "failure_type": outcome.failure_type,
        "reason": outcome.reason,
        "attempts": outcome.attempts,
        "over_long": outcome.prompt.over_long,
    }


def _ejections_by_shard(registry: CollectorRegistry) -> dict[str, int]:
    counts: dict[str, int] = {}
    for metric in registry.collect():
        if metric.name == "rollout_ejections":
            for sample in metric.samples:
                if sample.name == "rollout_ejections_total":
                    counts[sample.labels["shard"]] = int(sample.value)
    return counts


def _chaos_note(record: InjectedFault) -> str:
    fault = record.fault
    if record.ended is None:
        return f"chaos: {fault.target}: {_CHAOS_NOTES[fault.kind] if fault.flap_seconds is None else 'starts flapping'}"
    return f"chaos: {fault.target}: {_CHAOS_ENDED[fault.kind] if fault.flap_seconds is None else 'flapping stops'}"


_CHAOS_NOTES = {
    FaultKind.SHARD_KILL: "SIGKILL: the shard process dies",
    FaultKind.SHARD_HANG: "SIGSTOP: the shard hangs with requests in flight",
    FaultKind.ERROR_BURST_5XX: "a burst of 503s",
}
_CHAOS_ENDED = {
    FaultKind.SHARD_KILL: "the killed shard comes back",
    FaultKind.SHARD_HANG: "SIGCONT: the hung shard resumes",
    FaultKind.ERROR_BURST_5XX: "the burst is over",
}
