"""Fixtures for the fleet operator's end-to-end tests on the real control plane.

- ``fleet_crds``: the generated CRDs applied once per session (and Established).
- ``fleet_namespace``: a fresh namespace per test (there is no namespace controller: names are never reused).
- :class:`OperatorProcess`: ``rollout-fleet operator`` as a real subprocess (SIGTERM for graceful shutdown).
- :func:`wait_for_object`: list, then watch, until a predicate holds on one object: tests await state changes
  instead of sleeping or polling.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from fleet_operator.crds import KINDS, generate_crds
from rollout_runtime.kube.errors import api_error_is_transient
from rollout_runtime.kube.kinds import API_VERSION, GROUP, VERSION
from rollout_runtime.shards import Shard
from support.controlplane import ControlPlane
from support.deadlines import deadline
from support.processes import ManagedProcess, free_port

ROLLOUT_FLEET_CLI = Path(sys.executable).parent / "rollout-fleet"


@pytest.fixture(scope="session")
def fleet_crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with the generated CRDs installed and Established."""
    control_plane.apply(*(yaml.safe_load(text) for text in generate_crds().values()))
    for info in KINDS:
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{info.crd_name}", "--timeout=60s")
    return control_plane


@pytest.fixture
def fleet_namespace(fleet_crds: ControlPlane) -> str:
    return fleet_crds.create_namespace(f"fleet-{uuid.uuid4().hex[:8]}")


@asynccontextmanager
async def api_client(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    async with await config.new_client_from_config(config_file=str(kubeconfig)) as api:
        yield api


async def wait_for_object(
    api: client.ApiClient,
    plural: str,
    namespace: str,
    name: str,
    predicate: Callable[[Mapping[str, Any]], bool],
    *,
    guard_seconds: float = 60.0,
) -> dict[str, Any]:
    """The first version of the object (current, or arriving by watch) for which ``predicate`` holds.

    ``guard_seconds`` only guards against a hung test; nothing is asserted about how long it took. If it runs out,
    the test fails showing the last version of the object it saw (or that it never saw one).
    """
    custom = client.CustomObjectsApi(api)
    selector = f"metadata.name={name}"
    last: list[Mapping[str, Any]] = []

    def waited_for() -> str:
        seen = f"last seen: {_summary(last[-1])}" if last else "the object never appeared"
        return f"{plural} {namespace}/{name} to satisfy the predicate; {seen}"

    async with deadline(waited_for, guard_seconds):
        while True:
            try:
                listing = await custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural, field_selector=selector
                )
            except (ApiException, aiohttp.ClientError) as exc:  # an API server (re)starting: 429, 5xx, refused
                if not api_error_is_transient(exc):
                    raise
                await asyncio.sleep(0.5)  # retry pause, not synchronisation
                continue
            for item in listing["items"]:
                last.append(item)
                if predicate(item):
                    return dict(item)
            response = await custom.list_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                plural,
                field_selector=selector,
                watch=True,
                resource_version=listing["metadata"]["resourceVersion"],
                timeout_seconds=max(1, int(guard_seconds)),
                _preload_content=False,
            )
            try:
                while line := await response.content.readline():
                    event = json.loads(line)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        last.append(event["object"])
                        if predicate(event["object"]):
                            return dict(event["object"])
            except aiohttp.ClientError:
                continue  # the watch broke (API server restarting): list again
            finally:
                response.release()


def _summary(obj: Mapping[str, Any], limit: int = 2000) -> str:
    """An object's resourceVersion, spec and status as bounded JSON: what a failed wait needs to explain itself."""
    shown = {
        "resourceVersion": (obj.get("metadata") or {}).get("resourceVersion"),
        "spec": obj.get("spec"),
        "status": obj.get("status"),
    }
    text = json.dumps(shown, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def status_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status") or {})


API = API_VERSION
"""The apiVersion of our objects (test modules import it from here)."""


def fleet_objects(
    shards: Iterable[Shard], probe: Mapping[str, Any], *, environment_endpoint: str | None = None
) -> list[dict[str, Any]]:
    """A GenerationShard per shard (labelled fleet=a), optionally an EnvironmentServer "env", and RolloutFleet "a"
    selecting them: the fleet most operator e2e tests reconcile."""
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": API,
            "kind": "GenerationShard",
            "metadata": {"name": s.name, "labels": {"fleet": "a"}},
            "spec": {"endpoint": s.endpoint, "model": s.model, "probe": dict(probe)},
        }
        for s in shards
    ]
    fleet_spec: dict[str, Any] = {"shardSelector": {"matchLabels": {"fleet": "a"}}}
    if environment_endpoint is not None:
        objects.append(
            {
                "apiVersion": API,
                "kind": "EnvironmentServer",
                "metadata": {"name": "env", "labels": {"fleet": "a"}},
                "spec": {"endpoint": environment_endpoint, "protocol": "verifier", "probe": dict(probe)},
            }
        )
        fleet_spec["environmentServerSelector"] = {}
    objects.append({"apiVersion": API, "kind": "RolloutFleet", "metadata": {"name": "a"}, "spec": fleet_spec})
    return objects


def published_names(obj: Mapping[str, Any]) -> set[str]:
    """The shard names in a RolloutFleet's published healthy set."""
    return {entry["name"] for entry in status_of(obj).get("shards", [])}


class OperatorProcess:
    """``rollout-fleet operator`` in a subprocess, configured through FLEET_OPERATOR_* like in a pod."""

    def __init__(self, plane: ControlPlane, namespace: str, log_dir: Path, *, identity: str, **settings: Any) -> None:
        self.port = free_port()
        self.identity = identity
        env = {
            **plane.env(),
            "FLEET_OPERATOR_KUBECONFIG": str(plane.kubeconfig),
            "FLEET_OPERATOR_NAMESPACES": namespace,
            "FLEET_OPERATOR_LEASE_NAMESPACE": namespace,
            "FLEET_OPERATOR_IDENTITY": identity,
            "FLEET_OPERATOR_HTTP_HOST": "127.0.0.1",
            "FLEET_OPERATOR_HTTP_PORT": str(self.port),
            "FLEET_OPERATOR_PROBE_ALLOW_LOOPBACK": "true",
            "FLEET_OPERATOR_STATUS_HEARTBEAT_SECONDS": "5",
            "FLEET_OPERATOR_FLEET_COALESCE_SECONDS": "0.2",
            "FLEET_OPERATOR_LEASE_DURATION_SECONDS": "6",
            "FLEET_OPERATOR_LEASE_RENEW_SECONDS": "1",
            "FLEET_OPERATOR_LOG_LEVEL": "DEBUG",
        }
        env.update({f"FLEET_OPERATOR_{key.upper()}": str(value) for key, value in settings.items()})
        self.process = ManagedProcess(
            f"operator-{identity}", [ROLLOUT_FLEET_CLI, "operator"], log_dir / f"operator-{identity}.log", env=env
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process.start()

    async def stop(self) -> int | None:
        """SIGTERM and wait (off the event loop); the exit code."""
        await asyncio.to_thread(self.process.stop, 30.0)
        return self.process.popen.returncode if self.process.popen is not None else None

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as response:
            return response.status, await response.text()

    async def wait_role(self, role: str, guard_seconds: float = 60.0) -> None:
        """Wait until /readyz reports ``role`` (the process is external: its endpoint is the only signal)."""
        seen: list[str] = []
        async with deadline(lambda: f"operator {self.identity} to be {role}; /readyz said {seen[-1:]}", guard_seconds):
            while True:
                if not self.process.running:
                    raise RuntimeError(f"operator {self.identity} exited:\n{self.log_tail()}")
                try:
                    _, body = await self.get("/readyz")
                    seen.append(body[:500])
                    state = json.loads(body)
                    if state.get("role") == role and (role != "leader" or state.get("ready")):
                        return
                except (aiohttp.ClientError, ValueError):
                    pass
                await asyncio.sleep(0.1)

    async def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """The sum of the samples of ``name`` on /metrics whose labels include ``labels`` (0 when none)."""
        from prometheus_client.parser import text_string_to_metric_families

        _, text = await self.get("/metrics")
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items())
        )

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.process.log_path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def operator_processes(tmp_path: Path) -> Iterator[list[OperatorProcess]]:
    """Operators started by the test are appended here and stopped (by pid) after it."""
    started: list[OperatorProcess] = []
    yield started
    for operator in started:
        operator.process.stop()
