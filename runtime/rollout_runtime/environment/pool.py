"""Episodes across the healthy set of environment servers, with the dispatcher's selection, ejection and redispatch.

An :class:`EnvironmentPool` is a :class:`~rollout_runtime.dispatch.Dispatcher` whose "shards" are environment
servers: any :class:`~rollout_runtime.shards.ShardSource` of them works (a :class:`LocalShardSource` probing their
``/health``, a static list, or :class:`KubernetesShardSource` with ``members="environmentServers"``, which reads the
environment servers the operator publishes in a RolloutFleet's status). Its ejection state is its own, so an
environment server's failures never eject a generation shard, and the other way round.

Per episode (seed 004's controller side):

- an episode is placed by its ``episode_id`` (session affinity, :mod:`rollout_runtime.dispatch.affinity`): every
  attempt of it goes to the same server while that server is routable, which is where its live attempt and its
  checkpoint are;
- a failure is read as every rollout failure is (:class:`EnvironmentClient` maps the server's reply into the
  taxonomy): an infra one (the server died, refused, timed out, ``episode_in_progress``) redispatches the episode,
  with the same ``episode_id``, to the next server in its own order, and ejects the failed server when it is to
  blame; a data failure is the episode's own;
- on the new server the episode continues from its checkpoint where its protocol records boundaries and the servers
  share the checkpoint store (``--checkpoint-dir`` on shared storage), and restarts from its input otherwise
  (restart-only episodes never export one); the server decides, from what the store holds for that id. The pool
  gives an episode without an ``episode_id`` one before its first attempt, so a redispatch is the same episode.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

import aiohttp
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from rollout_runtime.dispatch import Completed, DataFailed, Dispatcher, DispatchEvent, DispatchPolicy, DispatchRun
from rollout_runtime.environment.client import EnvironmentClient
from rollout_runtime.environment.protocol import EpisodeResponse
from rollout_runtime.failures import RolloutDataFailure, RolloutInfraFailure
from rollout_runtime.shards.model import Shard, ShardSource

__all__ = ["EnvironmentPool", "Episode"]

R = TypeVar("R", bound=EpisodeResponse)


@dataclass(frozen=True, slots=True)
class Episode(Generic[R]):
    """One episode as the dispatcher's prompt: its request, the reply model, and its id as the affinity key."""

    payload: Mapping[str, Any]
    response_model: type[R]

    @property
    def affinity(self) -> str:
        return str(self.payload["episode_id"])


def _payload(request: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    payload = request.model_dump(mode="json") if isinstance(request, BaseModel) else dict(request)
    if not payload.get("episode_id"):
        payload["episode_id"] = uuid.uuid4().hex
    return payload


class EnvironmentPool:
    """Run episodes on the healthy environment servers of ``source``.

    ::

        async with EnvironmentPool(LocalShardSource(servers)) as pool:
            reply = await pool.run_episode({"values": [1, 2, 3]}, MultiStepResponse)
            async for outcome in pool.run(requests, MultiStepResponse):
                ...

    ``policy`` is the dispatcher's (budgets, backoff, ejection, attempt timeout); ``registry`` receives its
    ``rollout_*`` metrics (default: a private one, so they never mix with the generation dispatcher's).
    """

    def __init__(
        self,
        source: ShardSource,
        policy: DispatchPolicy | None = None,
        *,
        registry: CollectorRegistry | None = None,
        observer: Callable[[DispatchEvent], None] | None = None,
        connect_timeout_seconds: float = 10.0,
        seed: int | None = None,
    ) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.dispatcher = Dispatcher(source, policy, registry=registry, observer=observer, seed=seed)
        self._connect_timeout = connect_timeout_seconds
        self._session: aiohttp.ClientSession | None = None
        self._clients: dict[str, EnvironmentClient] = {}

    async def __aenter__(self) -> EnvironmentPool:
        await self.dispatcher.__aenter__()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout)
        self._session = aiohttp.ClientSession(timeout=timeout, trust_env=False)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.dispatcher.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._clients.clear()

    def run(
        self, requests: Iterable[BaseModel | Mapping[str, Any]], response_model: type[R]
    ) -> DispatchRun[Episode[R], R]:
        """Dispatch episodes; outcomes (Completed with the reply, DataFailed, Skipped) are keyed by episode id."""
        episodes = [Episode(_payload(request), response_model) for request in requests]
        return self.dispatcher.run(episodes, self._attempt, prompt_ids=[e.affinity for e in episodes], drop_rules=False)

    async def run_episode(self, request: BaseModel | Mapping[str, Any], response_model: type[R]) -> R:
        """One episode to its end; its reply, or the taxonomy failure it ended with."""
        outcomes = [outcome async for outcome in self.run([request], response_model)]
        (outcome,) = outcomes
        if isinstance(outcome, Completed):
            return outcome.result
        where = f"episode {outcome.prompt_id} on server(s) {list(outcome.shards)}"
        if isinstance(outcome, DataFailed):
            raise RolloutDataFailure(f"{where}: {outcome.failure_type}: {outcome.reason}")
        raise RolloutInfraFailure(f"{where}: {outcome.attempts} attempt(s) failed; last: {outcome.reason}")

    def _client(self, shard: Shard) -> EnvironmentClient:
        client = self._clients.get(shard.endpoint)
        if client is None:
            assert self._session is not None, "use the pool as `async with EnvironmentPool(...)`"
            client = self._clients[shard.endpoint] = EnvironmentClient(shard.endpoint, session=self._session)
        return client

    async def _attempt(self, shard: Shard, episode: Episode[R]) -> R:
        return await self._client(shard).run_episode(episode.payload, episode.response_model)
