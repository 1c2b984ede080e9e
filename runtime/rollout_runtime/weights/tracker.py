"""The trainer's side of weights: publish the policy version, refit shards, watch their identities.

:class:`WeightsTracker` is the authority for what the trainer pushed, and believes nothing else: a shard's version
is the one its last *successful* refit recorded, for the instance identity read right after that refit. A restart
shows as a new identity (:mod:`.identity`) and makes the shard Stale (no traffic) until the next refit
(:meth:`HealthState.observe_instance`). A refit drains first (the shard is Refitting, out of the healthy set, so
the dispatcher redispatches its attempts in flight), and any answer that still arrives is not committed: its
weights changed under it (:func:`~rollout_runtime.weights.weights_verdict`). A shard never serves half-updated.

::

    source = LocalShardSource(shards, identity=SGLangWeightVersion())
    weights = source.weights
    await weights.publish(step)
    async with weights.refit("shard-a", step):
        await push_weights_to("shard-a")          # e.g. POST /update_weights_from_disk
    # or, every shard at once:
    failed = await weights.refit_all(step, push_weights_to)

The tracker changes states through a :class:`StateHost` (the shard source that owns them), so every change shows
in the next healthy-set snapshot at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Protocol

import aiohttp

from rollout_runtime.health.hysteresis import HealthState, Transition
from rollout_runtime.weights import refit as shared
from rollout_runtime.weights.identity import IdentitySource
from rollout_runtime.weights.refit import RefitError

__all__ = ["RefitError", "StateHost", "WeightsTracker"]

log = logging.getLogger(__name__)

StateChange = Callable[[HealthState], Transition | None]


class StateHost(Protocol):
    """Owns the shards' HealthStates and publishes their changes (``LocalShardSource`` is one)."""

    @property
    def states(self) -> Mapping[str, HealthState]: ...

    def endpoint_of(self, name: str) -> str: ...

    async def change_state(self, name: str, change: StateChange) -> Transition | None: ...


def _marker(message: str) -> StateChange:
    return lambda state: state.mark_stale(message)


class WeightsTracker:
    """Policy version, per-shard weights versions and refits for the shards of one :class:`StateHost`.

    ``max_weights_lag`` should be the dispatcher's ``DispatchPolicy.max_weights_lag``: when :meth:`publish` moves
    the policy past a shard's version by more than that, the shard is marked Stale (out of routing) until refit, so
    the dispatcher never loops on answers it cannot commit.
    """

    def __init__(
        self,
        host: StateHost,
        *,
        identity: IdentitySource | None = None,
        max_weights_lag: int = 0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if max_weights_lag < 0:
            raise ValueError(f"max_weights_lag must be >= 0, got {max_weights_lag}")
        self._host = host
        self.identity = identity
        self.max_weights_lag = max_weights_lag
        self._policy_version: int | None = None
        self._session = session
        self._owned_session: aiohttp.ClientSession | None = None
        self._refits: dict[str, int] = {}
        """Refits begun per shard: an identity read that a refit began during may predate the update."""

    # -- what the dispatcher reads (WeightsView) ------------------------------------------------------------

    @property
    def policy_version(self) -> int | None:
        """The trainer's current policy version; None until :meth:`publish` (weights are then not tracked)."""
        return self._policy_version

    def version_of(self, shard: str) -> int | None:
        state = self._host.states.get(shard)
        return None if state is None else state.weights_version

    def stale_shards(self) -> dict[str, bool]:
        """Shard -> whether it is Stale or Refitting (restarted or being refit: no traffic)."""
        return {name: state.stale or state.refitting for name, state in self._host.states.items()}

    def host_states(self) -> Mapping[str, HealthState]:
        """The shards' live states (read-only use)."""
        return self._host.states

    def versions(self) -> dict[str, int | None]:
        return {name: state.weights_version for name, state in self._host.states.items()}

    # -- the trainer's API ---------------------------------------------------------------------------------

    async def publish(self, version: int) -> list[str]:
        """The trainer's policy is now ``version`` (monotonic: a lower one is an error); every refit shard now
        beyond ``max_weights_lag`` is marked Stale (out of routing until refit). Returns the shards marked."""
        self.set_policy_version(version)
        marked: list[str] = []
        for name, state in list(self._host.states.items()):
            held = state.weights_version
            if held is not None and version - held > self.max_weights_lag:
                message = f"weights version {held} lags policy {version} by more than {self.max_weights_lag}"
                if await self._host.change_state(name, _marker(message)) is not None:
                    marked.append(name)
        return marked

    def set_policy_version(self, version: int) -> None:
        """Record the policy version without marking lagging shards (prefer :meth:`publish`)."""
        self._policy_version = shared.next_policy_version(self._policy_version, version)

    @contextlib.asynccontextmanager
    async def refit(self, shard: str, version: int) -> AsyncIterator[None]:
        """Around the trainer's weight update of one shard: Refitting (no traffic) inside; on a clean exit the
        shard's identity is re-read and the version recorded for it; on an exception (or an unreadable identity)
        the shard is left Stale and the exception propagates (the sequence both writers share: :func:`.refit.refit`).

        ``version`` must not be ahead of the published policy version (publish first).
        """
        if shard not in self._host.states:
            raise KeyError(f"unknown shard {shard!r}")
        async with shared.refit(_TrackerSteps(self), shard, version):
            yield

    async def refit_all(
        self, version: int, update: Callable[[str], Awaitable[object]], shards: Iterable[str] | None = None
    ) -> dict[str, BaseException]:
        """Refit ``shards`` (default all) concurrently with ``update(name)``; return the failures by shard.

        One shard's failure does not stop the others; a failed shard stays Stale.
        """
        return await shared.refit_all(self.refit, version, update, self._host.states if shards is None else shards)

    # -- identity -------------------------------------------------------------------------------------------

    async def read_identity(self, shard: str) -> str | None:
        if self.identity is None:
            return None
        return await self.identity.identity(self._client(), shard, self._host.endpoint_of(shard))

    async def observe(self, shard: str, identity: str | None) -> Transition | None:
        """Feed one identity reading to the shard's state (see :meth:`HealthState.observe_instance`)."""
        if identity is None or shard not in self._host.states:
            return None
        transition = await self._host.change_state(shard, lambda s: s.observe_instance(identity))
        if transition is not None:
            log.warning("shard %s: %s", shard, transition.message)
        return transition

    async def poll(self) -> list[tuple[str, Transition]]:
        """Read every shard's identity once (concurrently) and feed it; return the transitions it caused.

        A shard being refit is skipped: its identity moves during the update, and the refit records the new one. So is
        a reading that a refit began (and possibly ended) during: it may be the identity from before the update.
        """
        names = [name for name, state in self._host.states.items() if not state.refitting]
        refits = {name: self._refits.get(name, 0) for name in names}
        readings = await asyncio.gather(*(self.read_identity(name) for name in names))
        changed: list[tuple[str, Transition]] = []
        for name, identity in zip(names, readings, strict=True):
            state = self._host.states.get(name)
            if state is None or state.refitting or self._refits.get(name, 0) != refits[name]:
                continue
            transition = await self.observe(name, identity)
            if transition is not None:
                changed.append((name, transition))
        return changed

    async def watch(self, period_seconds: float) -> None:
        """Poll identities every ``period_seconds`` until cancelled (the shard source runs this while iterated)."""
        while True:
            try:
                await self.poll()
            except Exception:  # a broken source must not stop the probes; the next poll tries again
                log.exception("identity poll failed")
            await asyncio.sleep(period_seconds)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is not None:
            return self._session
        if self._owned_session is None or self._owned_session.closed:
            self._owned_session = aiohttp.ClientSession()
        return self._owned_session

    async def aclose(self) -> None:
        if self._owned_session is not None:
            await self._owned_session.close()
            self._owned_session = None


class _TrackerSteps:
    """The refit steps in local mode: the shard's HealthState is the record (see :class:`.refit.RefitSteps`)."""

    def __init__(self, tracker: WeightsTracker) -> None:
        self._tracker = tracker
        self._host = tracker._host

    @property
    def policy_version(self) -> int | None:
        return self._tracker.policy_version

    async def begin(self, shard: str, version: int) -> None:
        self._tracker._refits[shard] = self._tracker._refits.get(shard, 0) + 1
        await self._host.change_state(shard, HealthState.begin_refit)

    async def identity_after(self, shard: str) -> str | None:
        if self._tracker.identity is None:
            return None
        identity = await self._tracker.read_identity(shard)
        if identity is None:
            raise RefitError(f"shard {shard}: could not read its identity after the update")
        return identity

    async def succeeded(self, shard: str, version: int, identity: str | None) -> None:
        await self._host.change_state(shard, lambda s: s.refit_succeeded(version, identity=identity))

    async def failed(self, shard: str, version: int, message: str) -> None:
        await self._host.change_state(shard, lambda s: s.refit_failed(message))
