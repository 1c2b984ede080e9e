"""The demo's generation shards: simulated (the default: fast, every fault kind) or real vLLM servers.

Everything the demo does is the same on both: the dispatcher, the prober, weights gating, the environment servers,
the failure ledger. What differs is here, in one place: how the fleet starts, how a shard's weights identity is read
and refit, how it is probed and which faults can hit it.

- **sim**: ``rollout-fleet sim-shard`` processes answering after a fixed latency; refit through SGLang's
  ``/update_weights_from_disk`` shape; chaos is SIGKILL, SIGSTOP, a flapping shard and a 503 burst.
- **vllm**: vLLM's CPU build (``scripts/install-tools.sh vllm``) serving the tiny model
  (:mod:`rollout_runtime.vllm.tool`); base weights ``v1``, the trainer's policy version 1 is the ``v2`` weight set,
  refit through vLLM's own endpoints (``/pause``, ``reload_weights``, ``/update_weight_version``, ``/resume``) and
  read back from ``/weight_info``; probed with a 1-token generation, since a frozen engine still answers ``/health``
  200; chaos is a server's whole process group SIGKILLed (back with base weights: Stale until refit) and an engine
  core SIGSTOPped. vLLM cannot be told to answer 503 on demand, so the flapping and burst faults are sim-only.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from rollout_runtime.health import ProbeSettings
from rollout_runtime.shards import Shard
from rollout_runtime.sim import SimFaults, SimFleet
from rollout_runtime.sim.chaos import Fault, FaultKind, FaultSchedule, ShardFleet
from rollout_runtime.weights import (
    IdentitySource,
    SGLangWeightVersion,
    VllmWeightInfo,
    update_weights_from_disk,
    vllm_reload_weights,
)

__all__ = ["DemoFleet", "DemoShards", "ShardEngine", "demo_shards"]

SIM_MODEL = "sim-model"
MAX_MODEL_LEN = 256
"""Both engines' context: the sim shard's flag and the vLLM servers' ``--max-model-len``."""


class ShardEngine(str, enum.Enum):
    SIM = "sim"
    VLLM = "vllm"


class DemoFleet(ShardFleet, Protocol):
    """A started fleet (:class:`~rollout_runtime.sim.SimFleet` or :class:`~rollout_runtime.vllm.fleet.VllmFleet`):
    the chaos injector's verbs plus the shards to route to."""

    @property
    def shards(self) -> list[Shard]: ...

    def shard(self, name: str) -> Shard: ...


Refit = Callable[[aiohttp.ClientSession, Shard, int], Awaitable[None]]


@dataclass(frozen=True)
class DemoShards:
    """What the demo needs from an engine."""

    fleet: AbstractAsyncContextManager[DemoFleet]
    """Entered, it starts the shards and yields them."""
    identity: IdentitySource
    probe: ProbeSettings
    refit: Refit
    """Move a shard to the trainer's weights of a policy version, through the engine's own API."""
    schedule: Callable[[Sequence[str]], FaultSchedule]
    description: str
    settle_seconds: float
    """How long a restarted shard may take to come back and be refit after the batch: its start time."""


def sim_chaos(names: Sequence[str]) -> FaultSchedule:
    """Kill, hang, flap and burst, each on its own shard, keeping one shard clean if possible.

    Each starts and ends at a fraction of the prompts finished, so every machine sees the same story.
    """
    plan: list[dict[str, Any]] = [
        {"kind": FaultKind.SHARD_KILL, "at_progress": 0.10, "until_progress": 0.30},  # back Stale, refit
        {"kind": FaultKind.SHARD_HANG, "at_progress": 0.20, "until_progress": 0.55},
        {"kind": FaultKind.ERROR_BURST_5XX, "at_progress": 0.25, "until_progress": 0.75, "flap_seconds": 1.5},
        {"kind": FaultKind.ERROR_BURST_5XX, "at_progress": 0.35, "until_progress": 1.0, "count": 20, "status": 503},
    ]
    return FaultSchedule.of([Fault(target=name, **fields) for name, fields in zip(names, plan, strict=False)])


def vllm_chaos(names: Sequence[str]) -> FaultSchedule:
    """One server's engine frozen, then (once it is back) another server killed: its restart takes tens of seconds,
    so it comes back while the batch goes on, Stale until refit. One fault at a time, so with two servers one always
    serves; a single server gets none (losing it would stop the batch, not show recovery)."""
    if len(names) < 2:
        return FaultSchedule()
    return FaultSchedule.of(
        [
            Fault(target=names[1], kind=FaultKind.SHARD_HANG, at_progress=0.10, until_progress=0.30),
            Fault(target=names[0], kind=FaultKind.SHARD_KILL, at_progress=0.40, until_progress=0.50),
        ]
    )


def demo_shards(
    engine: ShardEngine, count: int, *, seed: int, latency_seconds: float, vllm_tool: Path | None, log_dir: Path
) -> DemoShards:
    """The engine's fleet of ``count`` shards and how to probe, refit and hurt it (VllmMissing when vLLM is asked
    for and not installed)."""
    if engine is ShardEngine.SIM:

        async def push(http: aiohttp.ClientSession, shard: Shard, version: int) -> None:
            await update_weights_from_disk(http, shard.endpoint, f"/checkpoints/step-{version}", version)

        latency = SimFaults(slow_seconds=latency_seconds)  # so that chaos lands on requests in flight
        fleet = SimFleet(
            count,
            model=SIM_MODEL,
            max_model_len=MAX_MODEL_LEN,
            seed=seed,
            faults={f"shard-{i}": latency for i in range(count)},
        )
        probe = ProbeSettings(
            period_seconds=0.5, timeout_seconds=0.25, failure_threshold=2, success_threshold=2, check_model=True
        )
        # A killed sim shard restarts at SGLang's "default" version: Stale until refit.
        return DemoShards(fleet, SGLangWeightVersion(), probe, push, sim_chaos, f"{count} simulated shards", 20.0)

    from rollout_runtime.vllm.fleet import START_TIMEOUT_SECONDS, VllmFleet
    from rollout_runtime.vllm.tool import VllmTool

    tool = VllmTool.from_env() if vllm_tool is None else VllmTool(vllm_tool)
    model = tool.require().tiny_model()

    async def reload(http: aiohttp.ClientSession, shard: Shard, version: int) -> None:
        await vllm_reload_weights(http, shard.endpoint, str(model.v2), version)

    # A generation within the deadline (a frozen engine answers /health 200), skipped while requests complete: the
    # timeout sits above an engine step under the batch's load (the probe waits its turn in the batch), and the
    # period must exceed the timeout. A frozen engine leaves within 2 x 3 + 2.5 s; the attempts it holds time out
    # sooner (the policy's attempt timeout) and are redispatched.
    probe = ProbeSettings(
        period_seconds=3.0,
        timeout_seconds=2.5,
        failure_threshold=2,
        success_threshold=1,
        check_model=True,
        generate=True,
    )
    vllm = VllmFleet(count, tool.python, model.v1, log_dir)
    description = f"{count} vLLM servers"
    return DemoShards(vllm, VllmWeightInfo(), probe, reload, vllm_chaos, description, START_TIMEOUT_SECONDS)
