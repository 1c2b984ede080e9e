"""Control-plane chaos on a real kube-apiserver + etcd: restarts and crashes of the apiserver, etcd and the operator
while a trainer's Dispatcher follows the fleet through KubernetesShardSource.

The control plane here is this module's own (restarting the session's shared one would disturb other tests). The
batch is held at a gate half-way, so the whole fault sequence lands on a run in progress; after every fault the test
proves the healthy set still follows the fleet (a shard killed is dropped from the trainer's view, a shard restarted
comes back). Then the gate opens and every prompt must complete. Recovery times are written to
``reports/chaos/controlplane.json`` for the record; nothing asserts on time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_operator.crds import KINDS, generate_crds
from rollout_runtime.dispatch import Completed, Dispatcher, DispatchEvent, DispatchPolicy, HealthyShardsChanged
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import KubernetesShardSource, Shard
from rollout_runtime.sim import SimFleet, expected_answer
from support.chaos import report_dir
from support.controlplane import ControlPlane
from support.deadlines import deadline, within
from support.dispatch import assert_accounted, by_kind
from support.operator import OperatorProcess, api_client, fleet_objects, status_of, wait_for_object
from support.processes import wait_until

pytestmark = pytest.mark.e2e

PROBE = {"periodSeconds": 0.5, "timeoutSeconds": 0.4, "failureThreshold": 2, "successThreshold": 2}
PROMPTS = 240
GATE_AT = 120


@pytest.fixture(scope="module")
def chaos_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of our own, with the CRDs served."""
    plane = ControlPlane(tmp_path_factory.mktemp("chaos-controlplane"))
    try:
        plane.start()
        plane.apply(*(yaml.safe_load(text) for text in generate_crds().values()))
        for info in KINDS:
            plane.kubectl("wait", "--for=condition=Established", f"crd/{info.crd_name}", "--timeout=60s")
            plural = info.crd_name.split(".", 1)[0]
            wait_until(  # a new CRD's storage answers 429 for a moment after Established
                lambda plural=plural: plane.kubectl("get", plural, "-A", check=False).returncode == 0,  # type: ignore[misc]
                timeout=60,
                what=f"{plural} served",
            )
        yield plane
    finally:
        plane.stop()


class View:
    """The trainer's view of the healthy set, from the dispatcher's events; awaitable."""

    def __init__(self) -> None:
        self.healthy: frozenset[str] = frozenset()
        self.changed = asyncio.Event()

    def observe(self, event: DispatchEvent) -> None:
        if isinstance(event, HealthyShardsChanged):
            self.healthy = frozenset(event.healthy)
            self.changed.set()

    async def until(self, predicate: Callable[[frozenset[str]], bool], guard_seconds: float = 120.0) -> float:
        """Wait until the view satisfies ``predicate``; the seconds it took (recorded, never asserted)."""
        started = time.monotonic()
        async with deadline(
            lambda: f"the trainer's healthy set to reach the expected state; it is {sorted(self.healthy)}",
            guard_seconds,
        ):
            while not predicate(self.healthy):
                self.changed.clear()
                await self.changed.wait()
        return round(time.monotonic() - started, 2)


async def test_the_dispatcher_keeps_going_through_apiserver_etcd_and_operator_crashes(
    chaos_plane: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rollout_runtime.shards.kubernetes")
    plane = chaos_plane
    ns = plane.create_namespace("chaos")
    timeline: list[dict[str, Any]] = []
    operators: list[OperatorProcess] = []
    async with SimFleet(3, log_dir=tmp_path / "sim") as fleet, api_client(plane.kubeconfig) as api:
        plane.apply(*fleet_objects(fleet.shards, PROBE), namespace=ns)
        first = OperatorProcess(plane, ns, tmp_path, identity="op-1")
        operators.append(first)
        first.start()
        try:
            await first.wait_role("leader")
            everyone = set(fleet.names)
            await wait_for_object(
                api, "rolloutfleets", ns, "a", lambda o: {e["name"] for e in status_of(o).get("shards", [])} == everyone
            )
            source = KubernetesShardSource(
                "a", ns, kubeconfig=plane.kubeconfig, reconnect_initial_seconds=0.2, reconnect_max_seconds=2.0
            )
            policy = DispatchPolicy(
                max_infra_attempts=20,
                backoff_initial_seconds=0.05,
                backoff_max_seconds=1.0,
                attempt_timeout_seconds=60,
                healthy_wait_seconds=120,
                ejection_base_seconds=1,
                ejection_max_seconds=5,
                stall_deadline_seconds=600,
                max_concurrency=8,
            )
            view = View()
            gate = asyncio.Event()
            halfway = asyncio.Event()
            done = 0
            prompts = [f"What is {i} + {2 * i}?" for i in range(PROMPTS)]
            index = {prompt: i for i, prompt in enumerate(prompts)}

            async with (
                GenerationClient(timeout_seconds=30, connect_timeout_seconds=5) as generation,
                Dispatcher(source, policy, observer=view.observe, seed=1) as dispatcher,
            ):

                async def rollout(shard: Shard, prompt: str) -> str:
                    nonlocal done
                    if index[prompt] >= GATE_AT:
                        await gate.wait()
                    text = (await generation.complete(shard, prompt, max_tokens=8)).text
                    done += 1
                    if done >= GATE_AT:
                        halfway.set()
                    return text

                run = dispatcher.run(prompts, rollout)

                async def consume() -> list[Any]:
                    return [outcome async for outcome in run]

                consumer = asyncio.create_task(consume())
                await view.until(lambda healthy: healthy == everyone)
                await within(
                    halfway.wait(), lambda: f"{GATE_AT} prompts to complete before the faults; {done} did", 120
                )

                async def fault(name: str, action: Callable[[], Any]) -> None:
                    started = time.monotonic()
                    await asyncio.to_thread(action)
                    outage = round(time.monotonic() - started, 2)
                    # After each fault the set must still follow the fleet: kill a shard, see it leave; bring
                    # it back, see it return.
                    await fleet.kill("shard-0")
                    left = await view.until(lambda healthy: "shard-0" not in healthy)
                    await fleet.restart("shard-0")
                    back = await view.until(lambda healthy: "shard-0" in healthy)
                    assert first.process.running, first.log_tail()
                    timeline.append(
                        {
                            "fault": name,
                            "control_plane_action_seconds": outage,
                            "shard_left_view_seconds": left,
                            "shard_back_in_view_seconds": back,
                        }
                    )

                def crash_apiserver() -> None:
                    plane.kill_apiserver()
                    plane.start_apiserver()

                def crash_etcd() -> None:
                    plane.kill_etcd()
                    plane.start_etcd()

                def restart_both() -> None:
                    plane.stop_apiserver()
                    plane.restart_etcd()
                    plane.start_apiserver()

                await fault("apiserver graceful restart", plane.restart_apiserver)
                await fault("apiserver SIGKILL + start", crash_apiserver)
                await fault("etcd SIGKILL + start", crash_etcd)
                await fault("apiserver and etcd restarted together", restart_both)

                # The operator crashes; a shard dies while no operator runs; a new operator takes over and the
                # trainer's view follows again.
                started = time.monotonic()
                first.process.kill()
                await fleet.kill("shard-1")
                second = OperatorProcess(plane, ns, tmp_path, identity="op-2")
                operators.append(second)
                second.start()
                await second.wait_role("leader")
                left = await view.until(lambda healthy: "shard-1" not in healthy)
                timeline.append(
                    {
                        "fault": "operator SIGKILL, shard dies meanwhile, new operator",
                        "shard_left_view_seconds": round(time.monotonic() - started, 2),
                        "after_new_leader_seconds": left,
                    }
                )
                gate.set()
                outcomes = await within(consumer, lambda: f"the run to end after the gate opened ({run.stats})", 120)
                assert second.process.running, second.log_tail()
        finally:
            for operator in operators:
                await operator.stop()

    assert_accounted(run, outcomes, range(PROMPTS))
    completed = by_kind(outcomes)["completed"]
    assert len(completed) == PROMPTS
    for outcome in completed:
        assert isinstance(outcome, Completed)
        assert outcome.result.strip() == expected_answer(outcome.prompt)
    late = [o for o in completed if index[o.prompt] >= GATE_AT]
    assert all(o.shard != "shard-1" for o in late), "a prompt completed on a shard that was dead"
    assert source.relists >= 5, "the source re-listed after each control-plane outage"
    gone = caplog.text.count("410 Gone")
    report = {
        "scenario": "controlplane",
        "prompts": PROMPTS,
        "completed": len(completed),
        "lost": PROMPTS - len(outcomes) - len(run.aborted_ids()),
        "relists": source.relists,
        "watch_410_gone": gone,
        "timeline": timeline,
        "redispatches": run.stats.redispatches,
        "cancelled_attempts": run.stats.cancelled,
    }
    directory = report_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "controlplane.json").write_text(json.dumps(report, indent=2) + "\n")
