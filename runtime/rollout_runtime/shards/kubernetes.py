"""KubernetesShardSource: follow one RolloutFleet's status (written by the fleet operator) as HealthySet snapshots.

Uses kubernetes_asyncio, not the official synchronous client: the dispatcher's event loop runs every rollout, and
a blocking watch (or a thread per watch feeding the loop) would either stall it or add a thread hop to every
update. Here the watch is one more coroutine on that loop.

The protocol is the informer's: LIST the fleet (one object, by field selector) to get a resourceVersion, then
WATCH from it. A watch that ends (server timeout) resumes from the last seen version; ``410 Gone`` (the version
fell out of etcd's window) re-lists; a broken connection reconnects with exponential backoff and jitter. While
disconnected the last snapshot stays in force (the dispatcher's passive ejection still protects it).

This module is imported only when KubernetesShardSource is used (``rollout_runtime.shards`` re-exports it lazily),
so the runtime does not import kubernetes_asyncio otherwise.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from rollout_runtime.kube.api import EnvironmentServerEntry, HealthySetEntry, RolloutFleetStatus, read_fleet_status
from rollout_runtime.kube.config import load_client_configuration
from rollout_runtime.kube.errors import api_error_is_transient
from rollout_runtime.kube.kinds import GENERATION_SHARD, GROUP, ROLLOUT_FLEET, VERSION
from rollout_runtime.shards.kubernetes_weights import FleetWeights
from rollout_runtime.shards.model import HealthySet, Shard
from rollout_runtime.shards.registration import OwnerRef, registered_shard

if TYPE_CHECKING:
    from rollout_runtime.dispatch import DispatchPolicy

__all__ = ["KubernetesShardSource", "healthy_set_from_status"]

log = logging.getLogger(__name__)


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): re-list."""


def _unix(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    try:
        return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


MemberKind = Literal["shards", "environmentServers"]
"""Which of a RolloutFleet's published sets a source follows (``status.shards`` or ``status.environmentServers``):
generation shards, or environment servers."""


def _entries(status: RolloutFleetStatus, members: MemberKind) -> Sequence[HealthySetEntry | EnvironmentServerEntry]:
    return status.shards if members == "shards" else status.environment_servers


def healthy_set_from_status(
    status: RolloutFleetStatus | Mapping[str, Any] | None, members: MemberKind = "shards"
) -> HealthySet:
    """A RolloutFleet's ``status`` -> the HealthySet the dispatcher follows (revision taken from the status).

    ``status`` is read with the operator's own model (:func:`~rollout_runtime.kube.api.read_fleet_status`, when it
    is not one already). ``members="environmentServers"`` reads the environment servers instead (as Shard records: a
    name, an endpoint, a weight), for :class:`~rollout_runtime.environment.pool.EnvironmentPool`. Entries that do not
    parse are skipped with a log line rather than failing the whole set.
    """
    if not isinstance(status, RolloutFleetStatus):
        status = read_fleet_status(status)
    shards: list[Shard] = []
    probe_ok_at: dict[str, float] = {}
    for entry in _entries(status, members):
        served = entry if isinstance(entry, HealthySetEntry) else None
        try:
            shard = Shard(
                name=entry.name,
                endpoint=entry.endpoint,
                model=served.model if served else "",
                max_model_len=served.max_model_len if served else None,
                weight=entry.weight,
            )
        except ValidationError as exc:
            log.warning("skipping an unparseable healthy-set entry %r: %s", entry, exc)
            continue
        shards.append(shard)
        ok_at = _unix(served.last_success_time) if served else None
        if ok_at is not None:
            probe_ok_at[shard.name] = ok_at
    if not status.revision:  # an operator that has not written yet: derive one, so equal sets stay equal
        return HealthySet.of(shards, probe_ok_at)
    return HealthySet(
        revision=status.revision, shards=tuple(sorted(shards, key=lambda s: s.name)), probe_ok_at=probe_ok_at
    )


class KubernetesShardSource:
    """A ShardSource that watches one RolloutFleet; ``snapshots()`` yields a HealthySet per change.

    ::

        source = KubernetesShardSource("fleet-a", namespace="team-a")
        policy = await source.dispatch_policy()          # the fleet's spec.policy as a DispatchPolicy
        async with Dispatcher(source, policy) as dispatcher:
            async for outcome in dispatcher.run(prompts, rollout): ...

    A snapshot is yielded when the revision changes, or when only the probe times move (heartbeats), so the
    dispatcher can un-eject a shard a probe vouched for. A deleted fleet yields an empty set. :attr:`weights`
    follows the status's policy version and shard weights (:class:`~rollout_runtime.shards.kubernetes_weights.
    FleetWeights`); the trainer writes them through a ``PolicyVersionWriter``.
    """

    def __init__(
        self,
        fleet: str,
        namespace: str = "default",
        *,
        kubeconfig: str | Path | None = None,
        api_client: client.ApiClient | None = None,
        watch_timeout_seconds: int = 240,
        reconnect_initial_seconds: float = 0.5,
        reconnect_max_seconds: float = 30.0,
        members: MemberKind = "shards",
    ) -> None:
        if (
            watch_timeout_seconds < 1
            or reconnect_initial_seconds <= 0
            or reconnect_max_seconds < reconnect_initial_seconds
        ):
            raise ValueError("watch_timeout_seconds >= 1 and 0 < reconnect_initial_seconds <= reconnect_max_seconds")
        self.fleet = fleet
        self.namespace = namespace
        self.members: MemberKind = members
        """``"shards"``, or ``"environmentServers"`` to follow the fleet's environment servers."""
        self._kubeconfig = Path(kubeconfig) if kubeconfig is not None else None
        self._api_client = api_client
        self._watch_timeout = watch_timeout_seconds
        self._backoff_initial = reconnect_initial_seconds
        self._backoff_max = reconnect_max_seconds
        self.fleet_object: dict[str, Any] | None = None
        """The latest RolloutFleet seen (None before the first list, or after deletion)."""
        self.weights = FleetWeights()
        """The fleet status's policy version and shard weights: the dispatcher gates answers with it."""
        self.relists = 0
        """Times the source listed (the first time, after 410 Gone, after reconnects): for tests and logs."""

    async def _client(self) -> tuple[client.ApiClient, bool]:
        """The ApiClient to use, and whether we own it (and must close it)."""
        if self._api_client is not None:
            return self._api_client, False
        return client.ApiClient(await load_client_configuration(self._kubeconfig)), True

    async def get_fleet(self) -> dict[str, Any] | None:
        """One GET of the RolloutFleet (None if it does not exist)."""
        api_client, owned = await self._client()
        try:
            api = client.CustomObjectsApi(api_client)
            try:
                fleet: dict[str, Any] = await api.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, ROLLOUT_FLEET.plural, self.fleet
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return fleet
        finally:
            if owned:
                await api_client.close()

    async def dispatch_policy(self, **overrides: Any) -> DispatchPolicy:
        """The fleet's ``spec.policy`` as a DispatchPolicy (GETs the fleet if not yet seen); ``overrides`` win.

        A policy field this runtime does not know is an error (see ``DispatchPolicy.from_fleet``), not dropped.
        """
        from rollout_runtime.dispatch import DispatchPolicy

        if self.fleet_object is None:
            self.fleet_object = await self.get_fleet()
            if self.fleet_object is None:
                raise LookupError(f"RolloutFleet {self.namespace}/{self.fleet} not found")
        policy = (self.fleet_object.get("spec") or {}).get("policy") or {}
        return DispatchPolicy.from_fleet(policy, **overrides)

    async def register(
        self,
        name: str,
        endpoint: str,
        *,
        owner: OwnerRef | None = None,
        labels: Mapping[str, str] | None = None,
        model: str = "",
        max_model_len: int | None = None,
        probe: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Register a shard this trainer started as a GenerationShard in the fleet's namespace, owned by ``owner``
        (default: this pod, :meth:`OwnerRef.from_environment`) so it is garbage-collected with it.

        Labels default to ``rolloutfleet.dev/fleet: <fleet>`` (the fleet's shardSelector must select them).
        ``probe`` takes ProbeSettings fields, checked before the write (:func:`~.registration.probe_spec`).
        Registering the same name again with the same owner updates its spec (idempotent across trainer retries);
        a name owned by something else is a ``ValueError``. Needs the registrar role (chart ``rbac.registrar``).
        """
        owner = owner if owner is not None else OwnerRef.from_environment()
        body = registered_shard(
            name,
            endpoint,
            owner=owner,
            fleet=self.fleet,
            labels=labels,
            model=model,
            max_model_len=max_model_len,
            probe=probe,
        )
        api_client, owned = await self._client()
        try:
            api = client.CustomObjectsApi(api_client)
            plural = GENERATION_SHARD.plural
            try:
                created: dict[str, Any] = await api.create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, plural, body
                )
                return created
            except ApiException as exc:
                if exc.status != 409:
                    raise
            existing = await api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, name)
            owners = {ref.get("uid") for ref in (existing.get("metadata") or {}).get("ownerReferences") or []}
            if owner.uid not in owners:
                raise ValueError(
                    f"GenerationShard {self.namespace}/{name} exists and is not owned by {owner.kind} {owner.name}:"
                    " choose another name, or delete it first"
                )
            patch = {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]}
            patched: dict[str, Any] = await api.patch_namespaced_custom_object(  # type: ignore[call-arg]
                GROUP, VERSION, self.namespace, plural, name, patch, _content_type="application/merge-patch+json"
            )
            return patched
        finally:
            if owned:
                await api_client.close()

    async def unregister(self, name: str) -> bool:
        """Delete a registered shard before its owner ends (False: it was already gone)."""
        api_client, owned = await self._client()
        try:
            api = client.CustomObjectsApi(api_client)
            try:
                await api.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, GENERATION_SHARD.plural, name)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return True
        finally:
            if owned:
                await api_client.close()

    async def snapshots(self) -> AsyncIterator[HealthySet]:
        api_client, owned = await self._client()
        api = client.CustomObjectsApi(api_client)
        last: HealthySet | None = None
        delay = self._backoff_initial
        try:
            while True:
                try:
                    resource_version, snapshot = await self._list(api)
                    if snapshot != last:
                        last = snapshot
                        yield snapshot
                    async for snapshot in self._watch(api, resource_version):
                        delay = self._backoff_initial  # a working watch resets the backoff
                        if snapshot != last:
                            last = snapshot
                            yield snapshot
                except _Gone:
                    log.info("RolloutFleet %s/%s: watch expired (410 Gone); re-listing", self.namespace, self.fleet)
                    continue
                except (ApiException, OSError, TimeoutError, ValueError, aiohttp.ClientError) as exc:
                    # Retried whatever failed, as an informer does (the last snapshot stays in force). A garbled or
                    # empty watch (a plain ValueError) is the stream's weather; an answer that waiting cannot fix
                    # (the trainer's RBAC) is logged as an error.
                    garbled = isinstance(exc, ValueError) and not isinstance(exc, aiohttp.ClientError)
                    level = logging.WARNING if garbled or api_error_is_transient(exc) else logging.ERROR
                    pause = delay * random.uniform(0.5, 1.0)
                    log.log(
                        level,
                        "RolloutFleet %s/%s: %s; reconnecting in %.1f s",
                        self.namespace,
                        self.fleet,
                        f"{type(exc).__name__}: {exc}"[:300],
                        pause,
                    )
                    await asyncio.sleep(pause)
                    delay = min(self._backoff_max, delay * 2)
        finally:
            if owned:
                await api_client.close()

    def _snapshot(self, fleet: Mapping[str, Any] | None) -> HealthySet:
        self.fleet_object = dict(fleet) if fleet is not None else None
        status = read_fleet_status((fleet or {}).get("status"))
        self.weights.update(status)
        return healthy_set_from_status(status, self.members)

    async def _list(self, api: client.CustomObjectsApi) -> tuple[str, HealthySet]:
        self.relists += 1
        listing = await api.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, ROLLOUT_FLEET.plural, field_selector=f"metadata.name={self.fleet}"
        )
        items = [i for i in listing.get("items") or [] if (i.get("metadata") or {}).get("name") == self.fleet]
        return str(listing["metadata"]["resourceVersion"]), self._snapshot(items[0] if items else None)

    async def _watch(self, api: client.CustomObjectsApi, resource_version: str) -> AsyncIterator[HealthySet]:
        """Watch from ``resource_version`` until the server ends the watch; raise _Gone on 410."""
        loop = asyncio.get_running_loop()
        while True:
            started, events = loop.time(), 0
            try:
                response = await api.list_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    ROLLOUT_FLEET.plural,
                    field_selector=f"metadata.name={self.fleet}",
                    watch=True,
                    allow_watch_bookmarks=True,
                    resource_version=resource_version,
                    timeout_seconds=self._watch_timeout,
                    _preload_content=False,
                    _request_timeout=self._watch_timeout + 30,
                )
            except ApiException as exc:
                if exc.status == 410:
                    raise _Gone from exc
                raise
            try:
                while line := await response.content.readline():
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise _Gone
                        raise ApiException(status=obj.get("code"), reason=str(obj.get("message"))[:300])
                    resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
                    if kind == "BOOKMARK" or (obj.get("metadata") or {}).get("name") != self.fleet:
                        continue
                    events += 1
                    yield self._snapshot(None if kind == "DELETED" else obj)
            finally:
                response.release()
            if events == 0 and loop.time() - started < 1.0:
                # A watch that ends at once, empty, is not a server timeout: back off instead of spinning.
                raise ValueError("the watch ended immediately without events")
