"""Pod members end to end: real kube-apiserver, `rollout-fleet operator` as a subprocess, real sim shards on
127.0.0.1, and pods whose status the test writes as a kubelet would (podIP 127.0.0.1, the sim shard's port as the
container port named ``http``, Ready, containerStatuses[].restartCount). With the real kube-controller-manager's
garbage collector: a trainer-registered GenerationShard is deleted with its owner. States are awaited by watching
the API (tests/support/deadlines.py guards hangs); no sleeps, and times are printed, never asserted.

A Service's EndpointSlices come from the real EndpointSlice controller too. The API server refuses loopback
addresses in EndpointSlices (``may not be in the loopback range (127.0.0.0/8, ::1/128)``), so that test's sim shard
runs inside a network namespace the test makes (tests/support/netns.py: a veth pair on 10.250.N.0/24) and its pod
IP is the namespace's address; the operator's probe allowlist gains that /24 in that test only. Nothing talks to
any address outside 127.0.0.0/8 and that subnet."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rollout_runtime.dispatch import Dispatcher
from rollout_runtime.generation import GenerationClient
from rollout_runtime.shards import KubernetesShardSource, OwnerRef, Shard
from rollout_runtime.sim import SimFleet
from rollout_runtime.sim.shard import READY_PREFIX
from support.controllers import ControllerManager
from support.controlplane import ControlPlane
from support.deadlines import deadline
from support.dispatch import by_kind, collect
from support.netns import NetworkNamespace
from support.operator import ROLLOUT_FLEET_CLI, OperatorProcess, api_client, status_of, wait_for_object
from support.pods import pod
from support.tools import REPO_ROOT

pytestmark = pytest.mark.e2e

API = "rolloutfleet.dev/v1alpha1"
PROBE = {"periodSeconds": 0.5, "timeoutSeconds": 0.3, "failureThreshold": 2, "successThreshold": 2}
NODE = "node-loopback"
LWS = "leaderworkerset.sigs.k8s.io"


def published(obj: dict[str, Any]) -> dict[str, str | None]:
    """The fleet's healthy set as member name -> instance."""
    return {entry["name"]: entry.get("instance") for entry in status_of(obj).get("shards", [])}


def fleet_object(shard_pods: dict[str, Any], name: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "RolloutFleet",
        "metadata": {"name": name},
        "spec": {"shardPods": {"targetPort": {"name": "http"}, "probe": PROBE, "model": "sim-model", **shard_pods}},
    }


class Kubelet:
    """Creates pods and writes their status the way a kubelet would (there is none): IP, Ready, restart counts."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.uids: dict[str, str] = {}
        self.pod_ip = "127.0.0.1"
        """The IP written into every pod's status (a network namespace's address for EndpointSlice tests)."""
        self.host_ip = "127.0.0.1"

    async def run(self, name: str, port: int, *, labels: dict[str, str] | None = None, restarts: int = 0) -> str:
        """Create a pod on the node and report it Running and Ready at ``pod_ip``:``port``; its uid."""
        body = pod(name, uid="", ip=None, labels=labels or {"app": "sim"}, port=port, namespace=self.namespace)
        body["metadata"].pop("uid")
        body["apiVersion"], body["kind"] = "v1", "Pod"
        body["spec"]["nodeName"] = NODE
        body["spec"]["automountServiceAccountToken"] = False
        body["spec"]["containers"][0]["image"] = "rollout-fleet-sim:test"
        del body["status"]  # written through the status subresource, as the kubelet does
        created = await self.core.create_namespaced_pod(self.namespace, body)
        self.uids[name] = created.metadata.uid
        await self.report(name, ready=True, restarts=restarts)
        return str(created.metadata.uid)

    async def report(self, name: str, *, ready: bool, restarts: int) -> None:
        """PATCH the pod's status subresource: Running at ``pod_ip``, Ready or not, container restartCount."""
        ready_text = "True" if ready else "False"
        status = {
            "phase": "Running",
            "hostIP": self.host_ip,
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "conditions": [
                {"type": "Ready", "status": ready_text},
                {"type": "ContainersReady", "status": ready_text},
            ],
            "containerStatuses": [
                {
                    "name": "c",
                    "ready": ready,
                    "restartCount": restarts,
                    "image": "rollout-fleet-sim:test",
                    "imageID": "",
                    "started": ready,
                    "state": {"running": {"startedAt": "2026-12-01T10:00:00Z"}},
                }
            ],
        }
        await self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    async def terminate(self, name: str) -> None:
        """Delete with a grace period: with no kubelet to confirm, the pod stays Terminating (deletionTimestamp)."""
        await self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=300)

    async def remove(self, name: str) -> None:
        """Force-delete (grace 0): the pod is gone at once, as after the kubelet confirmed."""
        try:
            await self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise


async def prepare_namespace(plane: ControlPlane, api: client.ApiClient, namespace: str) -> Kubelet:
    """The default ServiceAccount (no controller creates it here) and the loopback Node pods are bound to."""
    core = client.CoreV1Api(api)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    try:
        await core.create_node({"metadata": {"name": NODE}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    return Kubelet(api, namespace)


@asynccontextmanager
async def operated(
    plane: ControlPlane, namespace: str, tmp_path: Path, operators: list[OperatorProcess], count: int
) -> AsyncIterator[tuple[SimFleet, client.ApiClient, Kubelet]]:
    async with SimFleet(count, log_dir=tmp_path / "sim") as sims, api_client(plane.kubeconfig) as api:
        kubelet = await prepare_namespace(plane, api, namespace)
        operator = OperatorProcess(plane, namespace, tmp_path, identity="op-pods")
        operators.append(operator)
        operator.start()
        await operator.wait_role("leader")
        yield sims, api, kubelet


def port_of(sims: SimFleet, name: str) -> int:
    return int(sims.shard(name).endpoint.rsplit(":", 1)[1])


async def fleet_until(api: client.ApiClient, ns: str, what: str, predicate: Any) -> dict[str, Any]:
    started = time.monotonic()
    found = await wait_for_object(api, "rolloutfleets", ns, "a", predicate)
    print(f"\n{what}: {time.monotonic() - started:.2f} s")
    return found


async def cli_members(plane: ControlPlane, namespace: str) -> dict[str, tuple[str, str, bool, str | None]]:
    """``rollout-fleet status a -o json``'s members: name -> (kind, phase, in set, instance)."""
    process = await asyncio.create_subprocess_exec(
        ROLLOUT_FLEET_CLI, "status", "a", "-n", namespace, "-o", "json",
        env=plane.env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with deadline("rollout-fleet status to answer", 60):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    members = json.loads(out)["members"]
    return {m["name"]: (m["kind"], m["phase"], m["inSet"], m.get("instance")) for m in members}


async def test_pod_members_follow_scaling_restarts_replacement_and_termination(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    ns = fleet_namespace
    async with operated(fleet_crds, ns, tmp_path, operator_processes, 4) as (sims, api, kubelet):
        fleet_crds.apply(fleet_object({"selector": {"matchLabels": {"app": "sim"}}}), namespace=ns)
        uid0 = await kubelet.run("sim-0", port_of(sims, "shard-0"))
        uid1 = await kubelet.run("sim-1", port_of(sims, "shard-1"))
        await kubelet.run("other", port_of(sims, "shard-3"), labels={"app": "not-selected"})
        first = await fleet_until(api, ns, "2 pods published", lambda o: set(published(o)) == {"sim-0", "sim-1"})
        assert published(first) == {"sim-0": f"{uid0}:0", "sim-1": f"{uid1}:0"}
        assert {e["endpoint"] for e in status_of(first)["shards"]} == {
            sims.shard("shard-0").endpoint,
            sims.shard("shard-1").endpoint,
        }
        assert await cli_members(fleet_crds, ns) == {
            "sim-0": ("ShardPod", "Healthy", True, f"{uid0}:0"),
            "sim-1": ("ShardPod", "Healthy", True, f"{uid1}:0"),
        }, "rollout-fleet status lists the pod members (and not the unselected pod)"

        # Scale up: a third pod joins.
        uid2 = await kubelet.run("sim-2", port_of(sims, "shard-2"))
        await fleet_until(api, ns, "scale-up to 3", lambda o: set(published(o)) == {"sim-0", "sim-1", "sim-2"})

        # An in-place container restart: same pod, same IP, restartCount + 1 (the sim server really restarts).
        await sims.restart("shard-0")
        await kubelet.report("sim-0", ready=True, restarts=1)
        restarted = await fleet_until(
            api, ns, "restarted pod back with a new instance", lambda o: published(o).get("sim-0") == f"{uid0}:1"
        )
        assert published(restarted)["sim-0"] != published(first)["sim-0"]

        # A replaced pod (same name, new UID) is a new instance too.
        await kubelet.remove("sim-2")
        await fleet_until(api, ns, "deleted pod gone", lambda o: "sim-2" not in published(o))
        new_uid2 = await kubelet.run("sim-2", port_of(sims, "shard-2"))
        assert new_uid2 != uid2
        await fleet_until(api, ns, "replacement published", lambda o: published(o).get("sim-2") == f"{new_uid2}:0")

        # Terminating (deletionTimestamp, no kubelet to finish it): out of the set at once, never routed to.
        await kubelet.terminate("sim-1")
        terminating = await fleet_until(api, ns, "terminating pod held out", lambda o: "sim-1" not in published(o))
        assert status_of(terminating)["healthy"] == "2/3", "still a member (Draining), just not serving"
        assert (await cli_members(fleet_crds, ns))["sim-1"] == ("ShardPod", "Draining", False, f"{uid1}:0")
        before = await sims.stats("shard-1")
        source = KubernetesShardSource("a", ns, kubeconfig=fleet_crds.kubeconfig)
        async with GenerationClient(timeout_seconds=30, connect_timeout_seconds=5) as generation:

            async def rollout(shard: Shard, prompt: str) -> str:
                return (await generation.complete(shard, prompt, max_tokens=4)).text

            async with Dispatcher(source, await source.dispatch_policy(), seed=0) as dispatcher:
                outcomes = await collect(dispatcher.run([f"{i} + 1?" for i in range(30)], rollout), seconds=120)
        assert len(by_kind(outcomes)["completed"]) == 30
        after = await sims.stats("shard-1")
        assert after.get("completions", 0) == before.get("completions", 0), "a terminating pod got traffic"
        assert sum([(await sims.stats(n)).get("completions", 0) for n in ("shard-0", "shard-2")]) >= 30

        # Scale down: the terminated pod goes away for good.
        await kubelet.remove("sim-1")
        gone = await fleet_until(api, ns, "scale-down", lambda o: status_of(o).get("totalShards") == 2)
        assert set(published(gone)) == {"sim-0", "sim-2"}


async def test_a_leaderworkerset_group_is_one_member_and_a_recreated_group_is_a_new_instance(
    fleet_crds: ControlPlane, fleet_namespace: str, tmp_path: Path, operator_processes: list[OperatorProcess]
) -> None:
    ns = fleet_namespace
    async with operated(fleet_crds, ns, tmp_path, operator_processes, 3) as (sims, api, kubelet):
        fleet_crds.apply(fleet_object({"selector": {"matchLabels": {f"{LWS}/name": "big"}}}), namespace=ns)
        group = {f"{LWS}/name": "big", f"{LWS}/group-index": "0"}
        leader = await kubelet.run("big-0", port_of(sims, "shard-0"), labels={**group, f"{LWS}/worker-index": "0"})
        for i in (1, 2):  # workers of the group (each listening too: proof they are skipped, not unreachable)
            await kubelet.run(
                f"big-0-{i}", port_of(sims, f"shard-{i}"), labels={**group, f"{LWS}/worker-index": str(i)}
            )
        one = await fleet_until(api, ns, "LWS leader published", lambda o: published(o) == {"big-0": f"{leader}:0"})
        assert status_of(one)["totalShards"] == 1

        # RecreateGroupOnPodRestart: the whole group is deleted and created again; the leader gets a new UID.
        for name in ("big-0", "big-0-1", "big-0-2"):
            await kubelet.remove(name)
        await fleet_until(api, ns, "group gone", lambda o: status_of(o).get("totalShards") == 0)
        new_leader = await kubelet.run("big-0", port_of(sims, "shard-0"), labels={**group, f"{LWS}/worker-index": "0"})
        await fleet_until(api, ns, "recreated group", lambda o: published(o) == {"big-0": f"{new_leader}:0"})
        assert new_leader != leader


async def wait_gone(api: client.ApiClient, plural: str, namespace: str, name: str, guard_seconds: float = 90) -> None:
    """Until the custom object is deleted (list, then watch for DELETED)."""
    custom = client.CustomObjectsApi(api)
    async with deadline(f"{plural} {namespace}/{name} to be deleted", guard_seconds):
        while True:
            listing = await custom.list_namespaced_custom_object(
                "rolloutfleet.dev", "v1alpha1", namespace, plural, field_selector=f"metadata.name={name}"
            )
            if not listing["items"]:
                return
            response = await custom.list_namespaced_custom_object(
                "rolloutfleet.dev",
                "v1alpha1",
                namespace,
                plural,
                field_selector=f"metadata.name={name}",
                watch=True,
                resource_version=listing["metadata"]["resourceVersion"],
                timeout_seconds=int(guard_seconds),
                _preload_content=False,
            )
            try:
                while line := await response.content.readline():
                    if json.loads(line)["type"] == "DELETED":
                        return
            except aiohttp.ClientError:
                continue
            finally:
                response.release()


def names(items: Iterable[dict[str, Any]]) -> set[str]:
    return {item["metadata"]["name"] for item in items}


async def test_a_trainer_registered_shard_is_probed_and_garbage_collected_with_its_owner(
    fleet_crds: ControlPlane,
    controller_manager: ControllerManager,
    fleet_namespace: str,
    tmp_path: Path,
    operator_processes: list[OperatorProcess],
) -> None:
    ns = fleet_namespace
    async with operated(fleet_crds, ns, tmp_path, operator_processes, 1) as (sims, api, kubelet):
        fleet = {
            "apiVersion": API,
            "kind": "RolloutFleet",
            "metadata": {"name": "a"},
            "spec": {"shardSelector": {"matchLabels": {"rolloutfleet.dev/fleet": "a"}}},
        }
        fleet_crds.apply(fleet, namespace=ns)
        trainer_uid = await kubelet.run("trainer", 1, labels={"app.kubernetes.io/component": "trainer"})
        owner = OwnerRef.from_environment({"POD_NAME": "trainer", "POD_UID": trainer_uid})
        source = KubernetesShardSource("a", ns, kubeconfig=fleet_crds.kubeconfig)
        shard = sims.shard("shard-0")
        created = await source.register("ray-actor-0", shard.endpoint, owner=owner, model=shard.model, probe=PROBE)
        assert created["metadata"]["ownerReferences"][0]["uid"] == trainer_uid
        again = await source.register("ray-actor-0", shard.endpoint, owner=owner, model=shard.model, probe=PROBE)
        assert again["metadata"]["uid"] == created["metadata"]["uid"], "re-registering is idempotent"
        stranger = OwnerRef(kind="Pod", name="someone-else", uid="0000")
        with pytest.raises(ValueError, match="not owned by"):
            await source.register("ray-actor-0", shard.endpoint, owner=stranger)
        await fleet_until(api, ns, "registered shard published", lambda o: set(published(o)) == {"ray-actor-0"})

        await kubelet.remove("trainer")  # the trainer ends; the real garbage collector deletes what it owned
        started = time.monotonic()
        await wait_gone(api, "generationshards", ns, "ray-actor-0")
        print(f"\ngarbage-collected {time.monotonic() - started:.2f} s after the owner's deletion")
        await fleet_until(api, ns, "fleet empty", lambda o: status_of(o).get("totalShards") == 0)
        assert not await source.unregister("ray-actor-0"), "already gone"


async def test_the_registrar_role_is_enough_to_register_and_unregister(
    fleet_crds: ControlPlane, fleet_namespace: str
) -> None:
    """The chart's registrar rules (create/get/patch/delete generationshards), bound in the trainer's namespace."""
    template = (REPO_ROOT / "charts/rollout-fleet/templates/clusterrole-registrar.yaml").read_text()
    rules_text = template.split("rules:", 1)[1].split("{{- end }}", 1)[0]
    rules = yaml.safe_load(rules_text)
    ns = fleet_namespace
    fleet_crds.apply(
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "reg"}, "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reg"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reg"},
            "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": ns}],
        },
        namespace=ns,
    )
    kubeconfig = fleet_crds.service_account_kubeconfig(ns, "trainer")
    source = KubernetesShardSource("a", ns, kubeconfig=kubeconfig)
    async with api_client(fleet_crds.kubeconfig) as api:
        # A real owner: the garbage collector (when a test started it) deletes dependents of a missing owner.
        kubelet = await prepare_namespace(fleet_crds, api, ns)
        owner = OwnerRef(kind="Pod", name="trainer", uid=await kubelet.run("trainer", 1))
    await source.register("s", "http://127.0.0.1:9", owner=owner)
    updated = await source.register("s", "http://127.0.0.1:10", owner=owner)
    assert updated["spec"]["endpoint"] == "http://127.0.0.1:10"
    assert await source.unregister("s")
    denied = fleet_crds.kubectl(
        "auth", "can-i", "list", "generationshards", "-n", ns, kubeconfig=kubeconfig, check=False
    )
    assert denied.stdout.strip() == "no", "the registrar role must not read other shards"


async def slice_until(
    api: client.ApiClient, namespace: str, service: str, what: str, predicate: Any, guard_seconds: float = 90
) -> list[dict[str, Any]]:
    """The Service's EndpointSlices (as the API returns them) once ``predicate`` holds on them (list, then watch)."""
    discovery = client.DiscoveryV1Api(api)
    selector = f"kubernetes.io/service-name={service}"
    slices: dict[str, dict[str, Any]] = {}
    started = time.monotonic()

    def waited_for() -> str:
        return f"EndpointSlices of {service}: {what}; last seen {list(slices.values())}"

    async with deadline(waited_for, guard_seconds):
        while True:
            listing = await discovery.list_namespaced_endpoint_slice(
                namespace, label_selector=selector, _preload_content=False
            )
            body = json.loads(await listing.read())
            slices = {item["metadata"]["name"]: item for item in body["items"]}
            if predicate(list(slices.values())):
                break
            response = await discovery.list_namespaced_endpoint_slice(
                namespace,
                label_selector=selector,
                watch=True,
                resource_version=body["metadata"]["resourceVersion"],
                timeout_seconds=int(guard_seconds),
                _preload_content=False,
            )
            try:
                done = False
                while not done and (line := await response.content.readline()):
                    event = json.loads(line)
                    name = event["object"]["metadata"]["name"]
                    if event["type"] == "DELETED":
                        slices.pop(name, None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        slices[name] = event["object"]
                    done = predicate(list(slices.values()))
                if done:
                    break
            except aiohttp.ClientError:
                continue
            finally:
                response.release()
    print(f"\n{what}: {time.monotonic() - started:.2f} s")
    return list(slices.values())


def slice_endpoints(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [endpoint for item in slices for endpoint in item.get("endpoints") or []]


async def test_a_services_endpointslices_from_the_real_controller_give_members_in_a_network_namespace(
    fleet_crds: ControlPlane,
    controller_manager: ControllerManager,
    network_namespace: NetworkNamespace,
    fleet_namespace: str,
    tmp_path: Path,
    operator_processes: list[OperatorProcess],
) -> None:
    """Service -> EndpointSlice by the real controller, for a pod whose IP is a network namespace's address where
    a real sim shard listens; the operator probes it through the veth and follows readiness and deletion."""
    assert "endpointslice-controller" in controller_manager.controllers
    ns, netns = fleet_namespace, network_namespace
    shard = netns.process(
        "sim-netns",
        [sys.executable, "-m", "rollout_runtime.cli.sim_shard", "--host", netns.ip, "--port", "0"],
        tmp_path / "sim-netns.log",
    )
    shard.start()
    try:
        ready = await shard.wait_ready_line(READY_PREFIX, 60)
        assert ready["host"] == netns.ip, "the sim shard must listen on the namespace's address only"
        port = int(ready["port"])
        async with api_client(fleet_crds.kubeconfig) as api:
            kubelet = await prepare_namespace(fleet_crds, api, ns)
            kubelet.pod_ip, kubelet.host_ip = netns.ip, netns.host_ip
            operator = OperatorProcess(
                fleet_crds, ns, tmp_path, identity="op-slices", probe_allowed_hosts=str(netns.subnet)
            )
            operator_processes.append(operator)
            operator.start()
            await operator.wait_role("leader")
            service = {
                "metadata": {"name": "sim"},
                "spec": {"selector": {"app": "sim"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
            }
            await client.CoreV1Api(api).create_namespaced_service(ns, service)
            fleet_crds.apply(fleet_object({"service": "sim"}), namespace=ns)
            uid = await kubelet.run("sim-0", port)

            def has_ready_endpoint(slices: list[dict[str, Any]]) -> bool:
                return any(
                    (e.get("conditions") or {}).get("ready") is True and e["addresses"] == [netns.ip]
                    for e in slice_endpoints(slices)
                )

            slices = await slice_until(api, ns, "sim", "the controller published the pod", has_ready_endpoint)
            managers = {item["metadata"]["labels"].get("endpointslice.kubernetes.io/managed-by") for item in slices}
            assert managers == {"endpointslice-controller.k8s.io"}, "written by the real controller, nobody else"
            (endpoint,) = slice_endpoints(slices)
            assert endpoint["targetRef"]["uid"] == uid
            assert [p["port"] for item in slices for p in item["ports"]] == [port], "targetPort http resolved"
            first = await fleet_until(api, ns, "slice member published healthy", lambda o: "sim-0" in published(o))
            assert published(first) == {"sim-0": f"{uid}:0"}
            assert [e["endpoint"] for e in status_of(first)["shards"]] == [f"http://{netns.ip}:{port}"]

            # Not Ready: the controller marks the endpoint not ready; the member is held out (Draining).
            await kubelet.report("sim-0", ready=False, restarts=0)
            await slice_until(
                api,
                ns,
                "sim",
                "endpoint not ready",
                lambda s: [(e.get("conditions") or {}).get("ready") for e in slice_endpoints(s)] == [False],
            )
            held = await fleet_until(api, ns, "not-ready member held out", lambda o: "sim-0" not in published(o))
            assert status_of(held)["totalShards"] == 1, "still a member, just not serving"
            shown = await cli_members(fleet_crds, ns)
            assert shown == {"sim-0": ("ShardPod", "Draining", False, f"{uid}:0")}, "status reads the slices too"

            # Ready again, then deleted: the slice empties and the member goes away.
            await kubelet.report("sim-0", ready=True, restarts=0)
            await fleet_until(api, ns, "ready again", lambda o: "sim-0" in published(o))
            await kubelet.remove("sim-0")
            await slice_until(api, ns, "sim", "endpoint removed", lambda s: bool(s) and not slice_endpoints(s))
            gone = await fleet_until(api, ns, "member gone", lambda o: status_of(o).get("totalShards") == 0)
            assert published(gone) == {}
    finally:
        shard.stop()
