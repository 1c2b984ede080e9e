"""Proof that the kmock emulator fixture serves built-in resources and stamps resourceVersions."""

from __future__ import annotations

from pathlib import Path

import kubernetes_asyncio

from support.kmockfix import VersionedKubernetesEmulator


async def test_emulator_stores_objects_with_growing_resource_versions(
    kube_emulator: VersionedKubernetesEmulator, tmp_path: Path
) -> None:
    kubeconfig = kube_emulator.write_kubeconfig(tmp_path / "kubeconfig")
    async with await kubernetes_asyncio.config.new_client_from_config(config_file=str(kubeconfig)) as client:
        core = kubernetes_asyncio.client.CoreV1Api(client)
        created = await core.create_namespaced_config_map(
            "ns1", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1"}}
        )
        patched = await core.patch_namespaced_config_map("cm", "ns1", {"data": {"a": "2"}})
        fetched = await core.read_namespaced_config_map("cm", "ns1")

    assert created.metadata.resource_version
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
    assert fetched.data == {"a": "2"}
    assert kube_emulator.objects["v1/configmaps", "ns1", "cm"]["data"] == {"a": "2"}
