"""Lease-based leader election (coordination.k8s.io/v1), so several replicas never reconcile at once.

Why a Lease and not kopf's peering: kopf's peering needs its own cluster-wide CRD (KopfPeering) and pauses *every*
replica when two share a priority, so replicas of one Deployment would need distinct priorities. A Lease is the
Kubernetes-native primitive (client-go's leaderelection, kube-controller-manager): replicas race to hold one Lease;
the holder renews it every ``lease_renew_seconds``; a standby takes over once the Lease has not changed for
``lease_duration_seconds`` *as observed on its own monotonic clock* (as client-go does), so clock skew between
nodes cannot cause two leaders. Writes are compare-and-swap on ``resourceVersion``: of two candidates, one gets 409.

A leader that cannot renew for ``renew_deadline`` (two thirds of the lease duration) stops reconciling before any
standby may take over. On graceful shutdown the leader releases the Lease so a standby takes over at once.

A failed round is retried whatever the error, as client-go's leaderelection does: a standby keeps campaigning and a
leader steps down at its deadline, so election fails safe rather than crashing a replica. Errors that waiting will
not fix (:func:`~rollout_runtime.kube.errors.api_error_is_transient` false: RBAC, a missing namespace) are logged as
errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rollout_runtime.kube.errors import api_error_is_transient

__all__ = ["LeaderElector", "LeaseAction", "LeaseRecord", "decide"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseRecord:
    """What matters of a Lease object."""

    holder: str | None
    resource_version: str
    duration_seconds: float
    transitions: int = 0


class LeaseAction(enum.Enum):
    CREATE = "create"
    """No Lease exists: create it, holding it."""
    RENEW = "renew"
    """We hold it: renew."""
    TAKE = "take"
    """Free or expired: take it (compare-and-swap)."""
    WAIT = "wait"
    """Someone else holds a live Lease."""


def decide(
    record: LeaseRecord | None,
    identity: str,
    *,
    unchanged_for: float,
) -> LeaseAction:
    """What a candidate does, given the Lease and how long (on our clock) it has been unchanged. Pure."""
    if record is None:
        return LeaseAction.CREATE
    if record.holder == identity:
        return LeaseAction.RENEW
    if not record.holder or unchanged_for >= record.duration_seconds:
        return LeaseAction.TAKE
    return LeaseAction.WAIT


def _severity(exc: BaseException) -> int:
    """WARNING for the API server's weather, ERROR for what someone must fix (the round is retried either way)."""
    return logging.WARNING if api_error_is_transient(exc) else logging.ERROR


def _micro_time() -> str:
    return dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for, holds and releases one Lease."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        duration_seconds: float,
        renew_seconds: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._api = client.CoordinationV1Api(api_client)
        self._name, self._namespace, self.identity = name, namespace, identity
        self._duration, self._renew = duration_seconds, renew_seconds
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._observed: tuple[str, float] | None = None
        """(resourceVersion, our clock when we first saw it)."""
        self.is_leader = False
        self.last_renewed: float | None = None

    @property
    def renew_deadline(self) -> float:
        return self._duration * 2 / 3

    async def _read(self) -> tuple[LeaseRecord | None, Any]:
        try:
            lease = await self._api.read_namespaced_lease(self._name, self._namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None, None
            raise
        spec = lease.spec
        record = LeaseRecord(
            holder=spec.holder_identity or None,
            resource_version=lease.metadata.resource_version,
            duration_seconds=float(spec.lease_duration_seconds or self._duration),
            transitions=int(spec.lease_transitions or 0),
        )
        return record, lease

    def _body(self, record: LeaseRecord | None, *, holder: str | None, acquire: bool) -> dict[str, Any]:
        now = _micro_time()
        spec: dict[str, Any] = {
            "holderIdentity": holder,
            "leaseDurationSeconds": max(1, round(self._duration)),
            "renewTime": now,
            "leaseTransitions": (record.transitions if record else 0) + (1 if acquire and record else 0),
        }
        if acquire:
            spec["acquireTime"] = now
        metadata: dict[str, Any] = {"name": self._name, "namespace": self._namespace}
        if record is not None:
            metadata["resourceVersion"] = record.resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    async def try_acquire_or_renew(self) -> bool:
        """One round: read, decide, write. True if we hold the Lease afterwards."""
        record, _ = await self._read()
        now = self._clock()
        if record is not None and (self._observed is None or self._observed[0] != record.resource_version):
            self._observed = (record.resource_version, now)
        unchanged_for = now - self._observed[1] if self._observed is not None else 0.0
        action = decide(record, self.identity, unchanged_for=unchanged_for)
        try:
            if action is LeaseAction.CREATE:
                await self._api.create_namespaced_lease(
                    self._namespace,
                    self._body(None, holder=self.identity, acquire=True),  # type: ignore[arg-type]
                )
            elif action in (LeaseAction.RENEW, LeaseAction.TAKE):
                assert record is not None
                await self._api.replace_namespaced_lease(
                    self._name,
                    self._namespace,
                    self._body(record, holder=self.identity, acquire=action is LeaseAction.TAKE),  # type: ignore[arg-type]
                )
            else:
                self.is_leader = False
                return False
        except ApiException as exc:
            if exc.status in (409, 422):  # another candidate won the compare-and-swap
                self.is_leader = False
                return False
            raise
        if not self.is_leader:
            log.info("leading: holding lease %s/%s as %s", self._namespace, self._name, self.identity)
        self.is_leader = True
        self.last_renewed = self._clock()
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until we lead (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            try:
                if await self.try_acquire_or_renew():
                    return True
            except (ApiException, OSError, TimeoutError, aiohttp.ClientError) as exc:
                log.log(_severity(exc), "lease %s/%s: %s", self._namespace, self._name, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._renew)
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew until ``stop`` is set; return early (leadership lost) if no renewal succeeds within the deadline."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self._renew)
                return
            except TimeoutError:
                pass
            try:
                if not await self.try_acquire_or_renew():
                    log.error("lost lease %s/%s to another replica", self._namespace, self._name)
                    return
            except (ApiException, OSError, TimeoutError, aiohttp.ClientError) as exc:
                log.log(_severity(exc), "lease renewal failed: %s", exc)
            if self.last_renewed is not None and self._clock() - self.last_renewed > self.renew_deadline:
                log.error("could not renew lease within %.1f s: stepping down", self.renew_deadline)
                self.is_leader = False
                return

    async def release(self) -> None:
        """Give the Lease up (graceful shutdown): a standby takes over without waiting for expiry."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            record, _ = await self._read()
            if record is not None and record.holder == self.identity:
                body = self._body(record, holder=None, acquire=False)
                body["spec"]["leaseDurationSeconds"] = 1
                await self._api.replace_namespaced_lease(self._name, self._namespace, body)  # type: ignore[arg-type]
                log.info("released lease %s/%s", self._namespace, self._name)
        except (ApiException, OSError, TimeoutError, aiohttp.ClientError) as exc:
            log.log(_severity(exc), "could not release lease: %s", exc)
