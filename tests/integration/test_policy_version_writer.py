"""PolicyVersionWriter against kmock's Kubernetes emulator: what the trainer writes for each refit outcome."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rollout_runtime.kube.config import load_client_configuration
from rollout_runtime.shards import PolicyVersionWriter
from support.kmockfix import VersionedKubernetesEmulator

PLURAL = "rolloutfleet.dev/v1alpha1/policyversions"


@pytest.fixture
async def emulator(kube_emulator: VersionedKubernetesEmulator) -> VersionedKubernetesEmulator:
    kube_emulator.resources[PLURAL] = {"kind": "PolicyVersion", "namespaced": True}
    return kube_emulator


@contextlib.asynccontextmanager
async def writer_for(emulator: VersionedKubernetesEmulator, tmp_path: Path) -> AsyncIterator[PolicyVersionWriter]:
    """A writer on its own client (a trainer process of its own)."""
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    async with client.ApiClient(await load_client_configuration(kubeconfig)) as api:
        yield PolicyVersionWriter("a", "ns", api_client=api)


def refits(emulator: VersionedKubernetesEmulator) -> dict[str, tuple[Any, ...]]:
    spec = emulator.objects[PLURAL, "ns", "a"]["spec"]
    return {r["shard"]: (r["version"], r["phase"]) for r in spec["refits"]}


async def test_refit_outcomes_are_recorded_per_shard_and_a_failure_propagates(
    emulator: VersionedKubernetesEmulator, tmp_path: Path
) -> None:
    async with writer_for(emulator, tmp_path) as writer:
        with pytest.raises(ValueError, match="publish"):
            await writer.record("s0", 1, "Succeeded")
        await writer.publish(1)
        assert emulator.objects[PLURAL, "ns", "a"]["spec"] == {"policyVersion": 1, "refits": []}

        async def update(name: str) -> None:
            assert refits(emulator)[name] == (1, "Refitting"), "the shard must be Refitting during its update"
            if name == "s1":
                raise OSError("push failed")

        failures = await writer.refit_all(1, update, ["s0", "s1"])
        assert set(failures) == {"s1"}
        assert isinstance(failures["s1"], OSError)
        assert refits(emulator) == {"s0": (1, "Succeeded"), "s1": (1, "Failed")}
        with pytest.raises(ValueError, match="backwards"):
            await writer.publish(0)


async def test_a_new_trainer_process_keeps_the_refits_an_earlier_one_recorded(
    emulator: VersionedKubernetesEmulator, tmp_path: Path
) -> None:
    async with writer_for(emulator, tmp_path) as first:
        await first.publish(3)
        async with first.refit("s0", 3):
            pass
    async with writer_for(emulator, tmp_path) as second:
        await second.publish(4)
        async with second.refit("s1", 4):
            pass
    assert emulator.objects[PLURAL, "ns", "a"]["spec"]["policyVersion"] == 4
    assert refits(emulator) == {"s0": (3, "Succeeded"), "s1": (4, "Succeeded")}
