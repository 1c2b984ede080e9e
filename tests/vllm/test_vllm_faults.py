"""Process faults on a real vLLM server (the session's victim; the shared servers carry the traffic that must go on).

vLLM is an API server plus an engine core process, and each fails its own way (issue 35):

- the engine core SIGSTOPped: ``/health`` keeps answering 200 while every generation hangs; only a generate probe
  (``ProbeSettings.generate``) or the attempt timeout tells, and the shard leaves the routable set within the
  probe bound;
- the engine core SIGKILLed: in-flight requests fail (vLLM answers 500 "EngineCore encountered an issue", or the
  connection drops) and the server exits by itself; the first such answer ejects the shard, nothing more is sent to
  it, and every prompt is redispatched and accounted for;
- the API server SIGKILLed: its engine core lives on as an orphan until the process group is swept; the server
  restarted on the same port reports weights ``"default"`` and is Stale until refit through vLLM's own endpoints
  (``/pause``, ``reload_weights``, ``/update_weight_version``, ``/resume``), read back from ``/weight_info``;
- SIGTERM (``VllmFleet.terminate``, the benchmarks' graceful verb): without ``--shutdown-timeout`` the server fails
  what is in flight and exits, its whole group with it.

Every test takes the victim fresh (``Victim.ensure_fresh``) and proves its fault hit (a pid gone, a request that
hangs, a 200 from ``/health`` while frozen) before asserting what the runtime made of it. The tests that leave the
victim as they found it (the frozen ones, thawed) come first, the ones that kill it after, so the session restarts
it as few times as it can (each restart is 23-68 s idle, minutes on a busy machine). The operator's half of the
frozen-engine case runs on the real kube-apiserver (marker ``e2e``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollout_runtime.dispatch import Dispatcher, DispatchPolicy
from rollout_runtime.dispatch.progress import bind_progress, unbind_progress
from rollout_runtime.generation import GenerationClient
from rollout_runtime.health import HealthPhase, HttpProber, ProbeReason, ProbeSettings
from rollout_runtime.health.targets import ProbeTargetPolicy
from rollout_runtime.shards import LocalShardSource, Shard
from rollout_runtime.sim.process import until
from rollout_runtime.vllm import MODEL_NAME, VllmServer
from rollout_runtime.vllm.fleet import VllmFleet
from rollout_runtime.weights import VllmWeightInfo, vllm_reload_weights
from support.controlplane import ControlPlane
from support.dispatch import ControlledSource, assert_accounted, by_kind, collect_until_error
from support.operator import (
    API,
    OperatorProcess,
    api_client,
    fleet_objects,
    published_names,
    status_of,
    wait_for_object,
)
from support.vllm import START_TIMEOUT_SECONDS, TinyModel, Victim, weight_version

POLICY = DispatchPolicy(
    backoff_initial_seconds=0.05,
    backoff_max_seconds=0.2,
    ejection_base_seconds=120,
    max_concurrency=4,
    attempt_timeout_seconds=20.0,
)
GENERATE_PROBE = ProbeSettings(
    period_seconds=2.0, timeout_seconds=1.5, failure_threshold=2, success_threshold=1, generate=True
)
LOOPBACK = ProbeTargetPolicy(allow_loopback=True)
LONG = {"ignore_eos": True}
"""A request long enough (64 tokens) to be in flight when the fault lands."""


def shard_of(server: VllmServer) -> Shard:
    return Shard(name=server.name, endpoint=server.url, model=MODEL_NAME)


@dataclass
class Attempts:
    """Every attempt: (shard, start time, end time, ok)."""

    log: list[tuple[str, float, float, bool]] = field(default_factory=list)

    def failures_on(self, name: str) -> list[float]:
        """When each failed attempt on ``name`` ended, in order."""
        return sorted(end for shard, _, end, ok in self.log if shard == name and not ok)

    def first_failure_on(self, name: str) -> float | None:
        ends = [end for shard, _, end, ok in self.log if shard == name and not ok]
        return min(ends) if ends else None

    def started_on_after(self, name: str, moment: float) -> int:
        return sum(1 for shard, start, _, _ in self.log if shard == name and start > moment)


async def batch(
    source: Any,
    prompts: list[str],
    fault: Callable[[], object],
    victim: VllmServer,
    policy: DispatchPolicy = POLICY,
) -> tuple[Any, ...]:
    """Run ``prompts``; the victim's first attempt is a long streamed generation, and ``fault`` lands once its first
    token arrived (the engine is generating it) and before it can end: 200 tokens take seconds, the signal none."""
    attempts = Attempts()
    injected: list[bool] = []
    async with GenerationClient(timeout_seconds=60) as client, Dispatcher(source, policy) as dispatcher:

        async def rollout(shard: Shard, prompt: str) -> str:
            start = time.monotonic()
            try:
                if shard.name == victim.name and not injected:
                    injected.append(True)
                    streaming = asyncio.Event()
                    bound = bind_progress(lambda tokens: streaming.set())  # copied into the request's task
                    try:
                        request = asyncio.create_task(
                            client.complete(shard, prompt, max_tokens=200, extra={**LONG, "stream": True})
                        )
                    finally:
                        unbind_progress(bound)
                    waiter = asyncio.ensure_future(streaming.wait())
                    try:
                        await asyncio.wait({request, waiter}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        waiter.cancel()
                    assert streaming.is_set(), f"no token of the long request from {victim.name} within 60 s"
                    assert not request.done(), "the victim's long request ended before the fault could land in it"
                    fault()
                    completion = await request
                else:
                    completion = await client.complete(shard, prompt, max_tokens=64, extra=LONG)
            except BaseException:
                attempts.log.append((shard.name, start, time.monotonic(), False))
                raise
            attempts.log.append((shard.name, start, time.monotonic(), True))
            return completion.text

        run = dispatcher.run(prompts, rollout)
        outcomes, error = await collect_until_error(run, seconds=300)
        return outcomes, error, run, dispatcher, attempts, bool(injected)


@contextlib.asynccontextmanager
async def probing(source: LocalShardSource) -> AsyncIterator[list[Any]]:
    """Iterate the source's snapshots in the background (probes and identity polls run meanwhile)."""
    seen: list[Any] = []

    async def follow() -> None:
        async for snapshot in source.snapshots():
            seen.append(snapshot)

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def pid_alive(pid: int) -> bool:
    """A process that has not exited (a zombie nobody reaped yet has exited: an orphan's reaper may be slow)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


async def test_a_frozen_engine_answers_health_200_and_the_generate_probe_takes_it_out(
    vllm_shared: list[VllmServer], vllm_victim_holder: Victim
) -> None:
    victim = await vllm_victim_holder.ensure_fresh()
    shards = [shard_of(vllm_shared[0]), shard_of(victim)]
    source = LocalShardSource(shards, GENERATE_PROBE, policy=LOOPBACK)
    probe = GENERATE_PROBE
    bound = probe.failure_threshold * probe.period_seconds + probe.timeout_seconds
    async with HttpProber(LOOPBACK) as prober, probing(source):
        await until(lambda: len(source.current().names()) == 2, timeout_seconds=60, what="both shards routable")
        frozen = victim.freeze_engine()
        try:
            health_only = await prober.probe(victim.url, probe.model_copy(update={"generate": False}))
            generate = await prober.probe(victim.url, probe, expected_model=MODEL_NAME)
            assert health_only.ok, "vLLM's /health answers 200 with its engine frozen: the fault the probe must see"
            assert generate.reason is ProbeReason.TIMEOUT, generate
            assert "generation" in (generate.message or ""), "the probe says which step hung"

            def out() -> bool:
                return victim.name not in source.current().names()

            await until(out, timeout_seconds=bound + 30, what=f"{victim.name} out of the routable set")
            assert source.phases()[victim.name] is HealthPhase.UNHEALTHY
            assert vllm_shared[0].name in source.current().names(), "the other shard's generations still pass"
            assert await victim.healthy(), "still 200 on /health: only the generate probe took it out"
            assert all(pid_alive(pid) for pid in frozen), "the engine is frozen, not dead"
        finally:
            victim.thaw_engine()
        await until(lambda: victim.name in source.current().names(), timeout_seconds=60, what="thawed, routable again")
    vllm_victim_holder.dirty = False  # left as found


async def test_a_frozen_engine_mid_batch_costs_one_attempt_timeout_and_loses_nothing(
    vllm_shared: list[VllmServer], vllm_victim_holder: Victim
) -> None:
    victim = await vllm_victim_holder.ensure_fresh()
    source = ControlledSource([shard_of(vllm_shared[0]), shard_of(victim)])
    frozen: list[int] = []
    policy = POLICY.model_copy(update={"attempt_timeout_seconds": 5.0})
    prompts = [f"a dog {i}" for i in range(8)]
    try:
        outcomes, error, run, dispatcher, attempts, hit = await batch(
            source, prompts, lambda: frozen.extend(victim.freeze_engine()), victim, policy
        )
        assert hit
        assert frozen, "the engine was never frozen"
        assert await victim.healthy(), "frozen, /health still answers 200"
    finally:
        victim.thaw_engine()
    assert error is None
    assert len(by_kind(outcomes)["completed"]) == 8
    assert run.stats.infra_failures >= 1, "the hung attempt timed out and was charged as infra"
    assert victim.name in dispatcher.ejected
    first = attempts.first_failure_on(victim.name)
    assert first is not None
    assert attempts.started_on_after(victim.name, first) == 0, "nothing sent to the frozen shard after it failed"
    assert_accounted(run, outcomes, range(8))
    async with GenerationClient(timeout_seconds=60) as client:
        thawed = await client.complete(shard_of(victim), "the cat", max_tokens=2, extra=LONG)
    assert thawed.completion_tokens == 2, "thawed, the engine generates again"
    vllm_victim_holder.dirty = False  # left as found


OPERATOR_PROBE = {
    "periodSeconds": 2,
    "timeoutSeconds": 1.5,
    "failureThreshold": 2,
    "successThreshold": 1,
    "generate": True,
}


@pytest.mark.e2e
async def test_the_operators_generate_probe_takes_a_frozen_vllm_engine_out_of_the_fleet(
    fleet_crds: ControlPlane,
    fleet_namespace: str,
    tmp_path: Path,
    operator_processes: list[OperatorProcess],
    vllm_shared: list[VllmServer],
    vllm_victim_holder: Victim,
) -> None:
    ns = fleet_namespace
    victim = await vllm_victim_holder.ensure_fresh()
    servers = [vllm_shared[0], victim]
    shards = [Shard(name=server.name, endpoint=server.url, model=MODEL_NAME) for server in servers]
    names = {shard.name for shard in shards}
    async with api_client(fleet_crds.kubeconfig) as api:
        fleet_crds.apply(*fleet_objects(shards, OPERATOR_PROBE), namespace=ns)
        stored = fleet_crds.kubectl_json("get", "generationshard", victim.name, "-n", ns)
        assert stored["spec"]["probe"]["generate"] is True, "the CRD keeps the field"
        assert stored["apiVersion"] == API
        operator = OperatorProcess(fleet_crds, ns, tmp_path, identity="op-vllm")
        operator_processes.append(operator)
        operator.start()
        await operator.wait_role("leader")
        await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == names)

        frozen = victim.freeze_engine()
        try:
            left = await wait_for_object(
                api, "rolloutfleets", ns, "a", lambda o: published_names(o) == {vllm_shared[0].name}
            )
            assert published_names(left) == {vllm_shared[0].name}
            assert await victim.healthy(), "/health still 200: only the generation told"
            assert frozen
            dead = status_of(fleet_crds.kubectl_json("get", "generationshard", victim.name, "-n", ns))
            assert dead["phase"] == "Unhealthy"
            assert dead["lastError"].startswith("timeout:"), dead
            assert "generation" in dead["lastError"]
        finally:
            victim.thaw_engine()
        await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == names)
    vllm_victim_holder.dirty = False  # thawed and serving again: left as found


async def test_a_killed_engine_core_fails_in_flight_requests_and_the_server_exits(
    vllm_shared: list[VllmServer], vllm_victim_holder: Victim
) -> None:
    victim = await vllm_victim_holder.ensure_fresh()
    source = ControlledSource([shard_of(vllm_shared[0]), shard_of(victim)])
    killed: list[int] = []
    prompts = [f"the cat {i}" for i in range(12)]
    outcomes, error, run, _, attempts, hit = await batch(
        source, prompts, lambda: killed.extend(victim.kill_engine()), victim
    )
    assert hit
    assert killed, "the engine core was never killed"
    await until(lambda: not any(map(pid_alive, killed)), timeout_seconds=30, what="the engine core dead")
    await until(lambda: not victim.running, timeout_seconds=60, what="the API server exiting by itself")
    assert error is None
    assert len(by_kind(outcomes)["completed"]) == len(prompts)
    assert run.stats.infra_failures >= 1, "the in-flight request really failed"
    assert attempts.failures_on(victim.name), "the victim's in-flight attempt failed"
    # vLLM answers 500 "EngineCore encountered an issue" once its engine died: the shard says it is broken, so the
    # first such answer ejects it (a plain 500 would wait for a second prompt's evidence: it may be a poison prompt's).
    first = attempts.first_failure_on(victim.name)
    assert first is not None
    assert attempts.started_on_after(victim.name, first) == 0, "nothing sent to the dead shard after it failed"
    assert_accounted(run, outcomes, range(len(prompts)))


async def test_a_restarted_server_is_stale_until_refit_through_vllms_own_endpoints(
    vllm_victim_holder: Victim, tiny_vllm_model: TinyModel
) -> None:
    victim = await vllm_victim_holder.ensure_fresh()
    settings = ProbeSettings(period_seconds=1.0, failure_threshold=2, success_threshold=1)
    source = LocalShardSource([shard_of(victim)], settings, policy=LOOPBACK, identity=VllmWeightInfo())
    weights = source.weights
    async with aiohttp.ClientSession() as http, probing(source):
        await until(lambda: victim.name in source.current().names(), timeout_seconds=30, what="the victim serving")
        await weights.publish(1)
        async with weights.refit(victim.name, 1):
            await vllm_reload_weights(http, victim.url, str(tiny_vllm_model.v2), 1)
        assert await weight_version(http, victim) == "1"

        engines = victim.engine_pids()
        api = victim.kill_api_server()
        await until(lambda: not pid_alive(api) or not victim.running, timeout_seconds=30, what="the API server dead")
        assert engines
        assert all(pid_alive(pid) for pid in engines), "vLLM leaves its engine core running when the API server dies"
        await victim.stop()
        assert victim.members() == []
        assert not any(map(pid_alive, engines)), "stopping the process group swept the orphaned engine"

        victim.start()
        await victim.wait_ready(START_TIMEOUT_SECONDS)
        assert await weight_version(http, victim) == "default", "a restart loads the base weights"

        def stale() -> bool:
            return source.phases()[victim.name] is HealthPhase.STALE

        await until(stale, timeout_seconds=60, what=f"{victim.name} Stale after its restart")
        assert victim.name not in source.current().names(), "a Stale shard is out of the routable set"

        async with weights.refit(victim.name, 1):
            await vllm_reload_weights(http, victim.url, str(tiny_vllm_model.v2), 1)
        assert await weight_version(http, victim) == "1"
        await until(lambda: victim.name in source.current().names(), timeout_seconds=30, what="routable after refit")
    vllm_victim_holder.mark_refit()  # running and well, at v2 weights


async def test_sigterm_fails_what_is_in_flight_and_takes_the_whole_group_down(
    vllm_shared: list[VllmServer], vllm_victim_holder: Victim
) -> None:
    victim = await vllm_victim_holder.ensure_fresh(base_weights=False)  # the previous test leaves it refit
    source = ControlledSource([shard_of(vllm_shared[0]), shard_of(victim)])
    engines = victim.engine_pids()
    assert engines
    prompts = [f"it is {i}" for i in range(8)]
    fleet = VllmFleet.of({victim.name: victim})  # the verb the benchmarks' rolling restart uses
    stopping: list[asyncio.Task[tuple[int | None, dict[str, int]]]] = []

    def terminate() -> None:
        stopping.append(asyncio.create_task(fleet.terminate(victim.name)))

    outcomes, error, run, _, _, hit = await batch(source, prompts, terminate, victim)
    assert hit
    _, counters = await stopping[0]  # returns once the whole group is gone
    assert not victim.running, "the API server outlived terminate()"
    assert not any(map(pid_alive, engines)), "its engine core outlived terminate()"
    assert "generation_tokens" in counters, f"vLLM's /metrics, read before the SIGTERM: {counters}"
    assert error is None
    assert len(by_kind(outcomes)["completed"]) == 8
    assert run.stats.infra_failures >= 1, "the in-flight request really failed"
    assert_accounted(run, outcomes, range(8))
