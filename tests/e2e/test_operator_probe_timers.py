"""The operator on a real kube-apiserver: another tenant's blackholed shard, with the largest timeout the CRD
allows, does not delay a killed shard's exit from its fleet's status. Nothing is asserted about time: the
blackhole's one probe stays pending for the whole test (so a probe round that waited for it could not have
finished), and the detection time is printed against the bound for the record."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from rollout_runtime.sim import SimFleet
from support.controlplane import ControlPlane
from support.httpserver import blackhole
from support.operator import (
    API,
    OperatorProcess,
    api_client,
    fleet_objects,
    published_names,
    status_of,
    wait_for_object,
)

pytestmark = pytest.mark.e2e

PROBE = {"periodSeconds": 0.5, "timeoutSeconds": 0.3, "failureThreshold": 2, "successThreshold": 2}
BLACKHOLE_PROBE = {"periodSeconds": 3600, "timeoutSeconds": 3599, "failureThreshold": 3, "successThreshold": 1}


def blackhole_shard(endpoint: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "GenerationShard",
        "metadata": {"name": "blackhole", "labels": {"fleet": "other-tenant"}},
        "spec": {"endpoint": endpoint, "model": "sim-model", "probe": BLACKHOLE_PROBE},
    }


async def test_a_blackholed_shard_does_not_delay_a_killed_shards_exit_from_the_fleet(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    ns = fleet_namespace
    async with (
        blackhole() as (hole_url, hits),
        SimFleet(2, log_dir=tmp_path / "sim") as fleet,
        api_client(fleet_crds.kubeconfig) as api,
    ):
        fleet_crds.apply(blackhole_shard(hole_url), namespace=ns)
        fleet_crds.apply(*fleet_objects(fleet.shards, PROBE), namespace=ns)
        operator = OperatorProcess(fleet_crds, ns, tmp_path, identity="op-a")
        operator_processes.append(operator)
        operator.start()
        await operator.wait_role("leader")
        await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: published_names(o) == set(fleet.names))
        assert hits == ["/health"], "the blackhole's probe is pending"

        killed_at = time.monotonic()
        await fleet.kill("shard-1")
        left = await wait_for_object(api, "rolloutfleets", ns, "a", lambda o: "shard-1" not in published_names(o))
        took = time.monotonic() - killed_at
        bound = PROBE["failureThreshold"] * PROBE["periodSeconds"] + PROBE["timeoutSeconds"]
        print(f"\nshard-1 left the fleet {took:.2f} s after SIGKILL (probe bound {bound:g} s + a status write)")

        assert published_names(left) == {"shard-0"}
        assert hits == ["/health"], "still the first probe: the killed shard's detection did not wait for it"
        hole = status_of(fleet_crds.kubectl_json("get", "generationshard", "blackhole", "-n", ns))
        assert hole.get("phase", "Pending") == "Pending"
        dead = status_of(fleet_crds.kubectl_json("get", "generationshard", "shard-1", "-n", ns))
        assert dead["phase"] == "Unhealthy"
        assert dead["lastError"].startswith("connect:")
