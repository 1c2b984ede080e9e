"""Weights in cluster mode: the trainer writes its fleet's PolicyVersion; the dispatcher reads the fleet's status.

Two halves, one per direction:

- :class:`PolicyVersionWriter` is the trainer's side. It owns the fleet's PolicyVersion object (same name and
  namespace as the RolloutFleet) and writes it on :meth:`~PolicyVersionWriter.publish` and around each refit
  (``Refitting`` before the update, ``Succeeded`` or ``Failed`` after). The trainer's RBAC is that one kind
  (``get``, ``create``, ``patch``; the chart's trainer Role), never a spec or a status: the operator reads the
  object and changes the shards' health (Stale, Refitting), so it stays the one writer of health.
- :class:`FleetWeights` is the dispatcher's side: a :class:`~rollout_runtime.weights.WeightsView` over the fleet's
  status (``policyVersion`` and every selected shard's ``weightsVersion``), updated by
  :class:`~rollout_runtime.shards.KubernetesShardSource` with each status it sees. The dispatcher gates every answer
  with it (``max_weights_lag``), as it does in local mode.

::

    source = KubernetesShardSource("fleet-a", namespace="team-a")
    writer = PolicyVersionWriter("fleet-a", namespace="team-a", weights=source.weights)
    await writer.publish(step)
    failed = await writer.refit_all(step, push_weights_to, shards=names)
    async with Dispatcher(source, await source.dispatch_policy()) as dispatcher: ...   # gated by source.weights

The writer is the object's only writer, so it keeps the desired spec and writes all of it (a JSON merge patch
replaces ``refits`` whole); concurrent refits share one write when they can (each change waits for a write that
includes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from rollout_runtime.kube.api import PolicyVersionSpec, RefitPhase, RefitRecord, RolloutFleetStatus, read_fleet_status
from rollout_runtime.kube.config import load_client_configuration
from rollout_runtime.kube.kinds import API_VERSION, GROUP, POLICY_VERSION, VERSION
from rollout_runtime.weights import refit as shared

__all__ = ["FleetWeights", "PolicyVersionWriter", "RefitPhase"]

log = logging.getLogger(__name__)


def _now() -> str:
    """RFC 3339 with microseconds: two refits of one shard never share a time (the operator tells them apart)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FleetWeights:
    """What the dispatcher reads of weights in cluster mode: the fleet status's policy version and shard weights.

    A shard the status does not list, or lists without a version, has unknown weights: once the trainer publishes a
    policy version, its answers are not committed.
    """

    def __init__(self) -> None:
        self._policy_version: int | None = None
        self._published: int | None = None
        self._versions: dict[str, int | None] = {}
        self._stale: dict[str, bool] = {}

    def update(self, status: RolloutFleetStatus | Mapping[str, Any] | None) -> None:
        """Take the weights from a RolloutFleet's ``status`` (None: the fleet is gone; nothing is known), read with the
        operator's model (:func:`~rollout_runtime.kube.api.read_fleet_status`: unparseable entries are skipped)."""
        if not isinstance(status, RolloutFleetStatus):
            status = read_fleet_status(status)
        self._policy_version = status.policy_version
        self._versions = {entry.name: entry.weights_version for entry in status.shard_weights}
        self._stale = {entry.name: entry.stale for entry in status.shard_weights}

    def published(self, version: int) -> None:
        """The trainer in this process published ``version``: gate by it at once, not only once the operator's next
        fleet status says so (the status can only catch up; the higher of the two wins)."""
        self._published = version if self._published is None else max(self._published, version)

    @property
    def policy_version(self) -> int | None:
        known = [v for v in (self._policy_version, self._published) if v is not None]
        return max(known) if known else None

    def version_of(self, shard: str) -> int | None:
        return self._versions.get(shard)

    def stale_shards(self) -> Mapping[str, bool]:
        return dict(self._stale)


class PolicyVersionWriter:
    """The trainer's PolicyVersion for one fleet (see the module docstring): publish, refit, refit_all.

    ``instance``, when given, reads a shard's instance identity by name right after its update, in the form the
    operator observes it (with pod discovery: the pod's ``<uid>:<restarts>``); it is recorded with the refit.
    ``weights``, the dispatcher's view in the same process (``KubernetesShardSource.weights``), learns each
    published version at once (see :meth:`FleetWeights.published`).
    """

    def __init__(
        self,
        fleet: str,
        namespace: str = "default",
        *,
        kubeconfig: str | Path | None = None,
        api_client: client.ApiClient | None = None,
        instance: Callable[[str], Awaitable[str | None]] | None = None,
        weights: FleetWeights | None = None,
    ) -> None:
        self.fleet = fleet
        self.namespace = namespace
        self._kubeconfig = Path(kubeconfig) if kubeconfig is not None else None
        self._api_client = api_client
        self._owned_client: client.ApiClient | None = None
        self._instance = instance
        self._weights = weights
        self._policy_version: int | None = None
        self._refits: dict[str, RefitRecord] = {}
        self._written: dict[str, Any] | None = None
        self._exists: bool | None = None
        self._lock = asyncio.Lock()
        self.writes = 0
        """Writes made (create or patch): for tests and logs."""

    @property
    def policy_version(self) -> int | None:
        return self._policy_version

    async def publish(self, version: int) -> None:
        """The trainer's policy is now ``version`` (a step; monotonic). The operator marks every shard that now lags
        it by more than the fleet's ``maxWeightsLag`` Stale."""
        self._policy_version = shared.next_policy_version(self._policy_version, version)
        if self._weights is not None:
            self._weights.published(version)  # before the write: a failed write leaves the gate stricter, not looser
        await self._flush()

    async def record(self, shard: str, version: int, phase: RefitPhase, instance: str | None = None) -> None:
        """Record the trainer's latest word on one shard's refit (prefer :meth:`refit`)."""
        shared.check_refit_version(self._policy_version, version)
        self._refits[shard] = RefitRecord(shard=shard, version=version, phase=phase, time=_now(), instance=instance)
        await self._flush()

    def refit(self, shard: str, version: int) -> contextlib.AbstractAsyncContextManager[None]:
        """Around the trainer's weight update of one shard: Refitting (no traffic) inside; Succeeded (with the
        instance read after the update) on a clean exit; Failed (Stale) on an exception, which propagates (the
        sequence both writers share: :func:`rollout_runtime.weights.refit.refit`)."""
        return shared.refit(_WriterSteps(self), shard, version)

    async def refit_all(
        self, version: int, update: Callable[[str], Awaitable[object]], shards: Iterable[str]
    ) -> dict[str, BaseException]:
        """Refit ``shards`` concurrently with ``update(name)``; return the failures by shard (each stays Stale)."""
        return await shared.refit_all(self.refit, version, update, shards)

    def _spec(self) -> dict[str, Any]:
        """The PolicyVersion's spec as written (its model checks it first: a refit is never ahead of the policy)."""
        refits = [self._refits[name] for name in sorted(self._refits)]
        return PolicyVersionSpec(policy_version=self._policy_version, refits=refits).to_kube()

    async def _flush(self) -> None:
        """Write the desired spec unless a write that includes it already happened (concurrent callers share one)."""
        async with self._lock:
            spec = self._spec()
            if spec == self._written:
                return
            api = client.CustomObjectsApi(await self._client())
            if self._exists is None:
                await self._adopt(api)
                spec = self._spec()
            if self._exists:
                await api.patch_namespaced_custom_object(  # type: ignore[call-arg]
                    GROUP,
                    VERSION,
                    self.namespace,
                    POLICY_VERSION.plural,
                    self.fleet,
                    {"spec": spec},
                    _content_type="application/merge-patch+json",
                )
            else:
                body = {
                    "apiVersion": API_VERSION,
                    "kind": POLICY_VERSION.kind,
                    "metadata": {"name": self.fleet, "namespace": self.namespace},
                    "spec": spec,
                }
                await api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, POLICY_VERSION.plural, body)
                self._exists = True
            self._written = spec
            self.writes += 1

    async def _adopt(self, api: client.CustomObjectsApi) -> None:
        """First write: keep the refits an earlier trainer process recorded (ours win), so its shards stay known."""
        try:
            existing: dict[str, Any] = await api.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, POLICY_VERSION.plural, self.fleet
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._exists = False
            return
        self._exists = True
        for entry in (existing.get("spec") or {}).get("refits") or []:
            try:
                record = RefitRecord.model_validate(entry)
            except ValidationError:
                log.warning("PolicyVersion %s/%s: skipping an unparseable refit %r", self.namespace, self.fleet, entry)
                continue
            self._refits.setdefault(record.shard, record)

    async def _client(self) -> client.ApiClient:
        if self._api_client is not None:
            return self._api_client
        if self._owned_client is None:
            self._owned_client = client.ApiClient(await load_client_configuration(self._kubeconfig))
        return self._owned_client

    async def aclose(self) -> None:
        if self._owned_client is not None:
            await self._owned_client.close()
            self._owned_client = None

    async def __aenter__(self) -> PolicyVersionWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _WriterSteps:
    """The refit steps in cluster mode: each is a PolicyVersion write the operator turns into the shard's health
    (see :class:`rollout_runtime.weights.refit.RefitSteps`)."""

    def __init__(self, writer: PolicyVersionWriter) -> None:
        self._writer = writer

    @property
    def policy_version(self) -> int | None:
        return self._writer.policy_version

    async def begin(self, shard: str, version: int) -> None:
        await self._writer.record(shard, version, "Refitting")

    async def identity_after(self, shard: str) -> str | None:
        instance = self._writer._instance
        return await instance(shard) if instance is not None else None

    async def succeeded(self, shard: str, version: int, identity: str | None) -> None:
        await self._writer.record(shard, version, "Succeeded", identity)

    async def failed(self, shard: str, version: int, message: str) -> None:
        await self._writer.record(shard, version, "Failed")
