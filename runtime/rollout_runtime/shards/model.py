"""What the dispatcher knows about the fleet: shards, and snapshots of the healthy set.

A :class:`ShardSource` is anything that yields :class:`HealthySet` snapshots: a static list, the runtime's own
probes (local mode), or a RolloutFleet's status in Kubernetes. The dispatcher follows the latest snapshot; a shard
that disappears from it is unhealthy, and attempts in flight on it are redispatched at once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Annotated, Protocol, runtime_checkable
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_FLEET = "local"
"""The fleet name of shard sources outside Kubernetes unless the caller names one (a ``fleet`` metric label)."""


class Shard(BaseModel):
    """One generation shard (an OpenAI-compatible server) as the dispatcher sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=253)]
    endpoint: str
    """Base URL, e.g. ``http://10.0.0.7:8000``; request paths are appended to it."""
    model: str = ""
    """The model the shard must serve; empty means "whatever it serves"."""
    max_model_len: Annotated[int, Field(gt=0)] | None = None
    weight: Annotated[float, Field(gt=0, le=1_000_000)] = 1.0

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint must be an http(s) URL with a host, got {value!r}")
        return value.rstrip("/")


class HealthySet(BaseModel):
    """A snapshot of the shards eligible for traffic. ``revision`` changes whenever the set does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    revision: str
    shards: tuple[Shard, ...] = ()
    probe_ok_at: Mapping[str, float] = Field(default_factory=dict)
    """Shard name -> wall-clock time of its latest successful active probe, when the source knows it.
    The dispatcher un-ejects a passively ejected shard once a probe succeeded after the ejection."""

    @classmethod
    def of(cls, shards: Iterable[Shard], probe_ok_at: Mapping[str, float] | None = None) -> HealthySet:
        """Build a snapshot whose revision is a digest of the shards (stable across processes)."""
        ordered = tuple(sorted(shards, key=lambda s: s.name))
        return cls(revision=revision_of(ordered), shards=ordered, probe_ok_at=dict(probe_ok_at or {}))

    def names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.shards)


def revision_of(shards: Iterable[Shard]) -> str:
    """A short digest of a shard list: equal sets give equal revisions, in any process."""
    payload = json.dumps([s.model_dump(mode="json") for s in sorted(shards, key=lambda s: s.name)], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@runtime_checkable
class ShardSource(Protocol):
    """Yields healthy-set snapshots; the first as soon as one is known, then one per change (or probe round).

    Sources that need background work (probing, watching) do it while ``snapshots()`` is being iterated and stop
    it when the iterator is closed, so ``async with contextlib.aclosing(source.snapshots())`` scopes them. A source
    whose iterator ends leaves its last snapshot in force.
    """

    def snapshots(self) -> AsyncIterator[HealthySet]: ...


@runtime_checkable
class ReportsCompletions(Protocol):
    """A shard source that hears of completed attempts: the dispatcher calls :meth:`attempt_succeeded` after every
    successful attempt (passive liveness: a shard completing requests is alive; see ``rollout_runtime.health``)."""

    def attempt_succeeded(self, name: str) -> None: ...


def fleet_identity(source: object) -> tuple[str, str]:
    """``(fleet, namespace)`` of a shard source, for the ``rollout_*`` metric labels.

    Optional attributes rather than part of :class:`ShardSource`, so any object with ``snapshots()`` stays a
    source: one without a ``fleet`` is ``DEFAULT_FLEET``, one without a ``namespace`` has none (``""``).
    """
    fleet = getattr(source, "fleet", None)
    namespace = getattr(source, "namespace", None)
    return (
        fleet if isinstance(fleet, str) and fleet else DEFAULT_FLEET,
        namespace if isinstance(namespace, str) else "",
    )


class StaticShardSource:
    """A fixed list of shards, all taken as healthy: for tests and for fleets that are probed elsewhere.

    ``fleet`` names the fleet in the dispatcher's metrics; it has no namespace.
    """

    namespace = ""

    def __init__(self, shards: Iterable[Shard], *, fleet: str = DEFAULT_FLEET) -> None:
        self._snapshot = HealthySet.of(shards)
        self.fleet = fleet

    async def snapshots(self) -> AsyncIterator[HealthySet]:
        yield self._snapshot
