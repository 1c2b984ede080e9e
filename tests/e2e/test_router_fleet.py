"""`rollout-fleet router --fleet` on the real kube-apiserver: the router follows a RolloutFleet the operator keeps,
as a subprocess, while a shard is killed for real. State changes are awaited through the router's /readyz (which
counts the routable shards it follows), never by sleeping."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from test_operator_fleet import operated_fleet

from rollout_runtime.router import SHARD_HEADER
from rollout_runtime.router.process import spawn_router
from rollout_runtime.sim.process import until
from support.controlplane import ControlPlane
from support.operator import OperatorProcess

pytestmark = pytest.mark.e2e


async def test_the_router_follows_the_fleet_and_stops_routing_to_a_shard_it_lost(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    ns = fleet_namespace
    async with operated_fleet(fleet_crds, ns, tmp_path, operator_processes) as (fleet, _, _):
        args = ["--fleet", "a", "--namespace", ns, "--kubeconfig", str(fleet_crds.kubeconfig)]
        async with (
            await spawn_router(args, log_path=tmp_path / "router.log") as router,
            aiohttp.ClientSession() as http,
        ):

            async def routable(count: int) -> bool:
                async with http.get(router.url + "/readyz") as response:
                    body = await response.json()
                    return response.status == 200 and body["routable"] == count

            await until(lambda: routable(3), timeout_seconds=60, what="3 routable shards", process=router.process)

            async def ask() -> str:
                body = {"prompt": "What is 2 + 5?", "max_tokens": 4}
                async with http.post(router.url + "/v1/completions", json=body) as response:
                    assert response.status == 200, await response.text()
                    assert (await response.json())["choices"][0]["text"] == "7"
                    return response.headers[SHARD_HEADER]

            before = {await ask() for _ in range(12)}
            await fleet.kill("shard-0")
            await until(
                lambda: routable(2), timeout_seconds=60, what="the fleet without shard-0", process=router.process
            )
            after = {await ask() for _ in range(12)}
            async with http.get(router.url + "/metrics") as response:
                metrics = await response.text()

    assert before == {"shard-0", "shard-1", "shard-2"}
    assert after == {"shard-1", "shard-2"}
    assert f'fleet="a",namespace="{ns}"' in metrics  # labelled with the fleet it follows
