"""One refit sequence for both of the trainer's weights writers: the local :class:`~.tracker.WeightsTracker` and the
cluster's :class:`~rollout_runtime.shards.kubernetes_weights.PolicyVersionWriter`.

A refit drains the shard first (Refitting: no traffic, its attempts in flight are redispatched), runs the trainer's
update, reads the shard's instance identity right after it, and records the version for that identity. Any failure
(the update raised, the identity could not be read) leaves the shard Stale, since it may hold half-updated weights,
and propagates. The two writers differ only in what those steps *do* (local: a HealthState change; cluster: a
PolicyVersion write the operator acts on), so each implements :class:`RefitSteps`; the order, the version rules and
the failure handling live here, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Final, Protocol

__all__ = [
    "MAX_FAILURE_MESSAGE_CHARS",
    "RefitError",
    "RefitSteps",
    "check_refit_version",
    "failure_message",
    "failures_by_shard",
    "next_policy_version",
    "refit",
    "refit_all",
]

log = logging.getLogger(__name__)

MAX_FAILURE_MESSAGE_CHARS: Final[int] = 400
"""Bound on a refit failure message: it lands in a shard's status and in logs."""


class RefitError(RuntimeError):
    """A refit could not be confirmed (the update raised, or the shard's identity could not be read after it)."""


class RefitSteps(Protocol):
    """What one writer does at each step of :func:`refit` (the sequence itself is not theirs to change)."""

    @property
    def policy_version(self) -> int | None:
        """The published policy version; a refit may not go beyond it."""
        ...

    async def begin(self, shard: str, version: int) -> None:
        """Drain: the shard is Refitting (no traffic) from now on. An exception here aborts the refit unrecorded."""
        ...

    async def identity_after(self, shard: str) -> str | None:
        """The shard's instance identity right after the update (None: not tracked); raise if it must be known but
        could not be read (the refit then fails)."""
        ...

    async def succeeded(self, shard: str, version: int, identity: str | None) -> None:
        """Record ``version`` for this instance: the shard may serve again."""
        ...

    async def failed(self, shard: str, version: int, message: str) -> None:
        """Leave the shard Stale, saying why."""
        ...


def next_policy_version(current: int | None, version: int) -> int:
    """``version`` if it may follow ``current`` (a step >= 0, never backwards); a ValueError saying why otherwise."""
    if version < 0:
        raise ValueError(f"a policy version is a step >= 0, got {version}")
    if current is not None and version < current:
        raise ValueError(f"policy version went backwards: {current} -> {version}")
    return version


def check_refit_version(policy_version: int | None, version: int) -> None:
    """A refit may not run ahead of the published policy (the dispatcher would not know the version yet)."""
    if policy_version is None or version > policy_version:
        raise ValueError(
            f"refit to version {version} but the published policy version is {policy_version}:"
            " call publish(version) first"
        )


def failure_message(exc: BaseException) -> str:
    """The bounded text a failed refit records."""
    return f"{type(exc).__name__}: {exc}"[:MAX_FAILURE_MESSAGE_CHARS]


@contextlib.asynccontextmanager
async def refit(steps: RefitSteps, shard: str, version: int) -> AsyncIterator[None]:
    """Around the trainer's weight update of one shard (see the module docstring): Refitting inside; on a clean exit
    the identity is read and the version recorded for it; on an exception the shard is left Stale and it propagates.

    A failure to record the failure is logged, never raised over the update's own exception (that is the one a
    trainer must see).
    """
    check_refit_version(steps.policy_version, version)
    await steps.begin(shard, version)
    try:
        yield
        identity = await steps.identity_after(shard)
    except BaseException as exc:
        message = failure_message(exc)
        log.warning("refit of shard %s to version %d failed: %s", shard, version, message)
        try:
            await steps.failed(shard, version, message)
        except Exception:
            log.exception("shard %s: could not record its failed refit", shard)
        raise
    await steps.succeeded(shard, version, identity)


def failures_by_shard(names: Sequence[str], results: Sequence[object]) -> dict[str, BaseException]:
    """The failed shards of a concurrent refit (``results`` as ``gather(..., return_exceptions=True)`` gives them);
    a cancellation is re-raised, not counted as one shard's failure."""
    failures: dict[str, BaseException] = {}
    for name, result in zip(names, results, strict=True):
        if isinstance(result, asyncio.CancelledError):
            raise result
        if isinstance(result, BaseException):
            failures[name] = result
    return failures


async def refit_all(
    refit_one: Callable[[str, int], AbstractAsyncContextManager[None]],
    version: int,
    update: Callable[[str], Awaitable[object]],
    shards: Iterable[str],
) -> dict[str, BaseException]:
    """Refit ``shards`` concurrently, each inside ``refit_one(name, version)`` around ``update(name)``; return the
    failures by shard. One shard's failure does not stop the others; a failed shard stays Stale."""
    names = list(shards)

    async def one(name: str) -> None:
        async with refit_one(name, version):
            await update(name)

    results = await asyncio.gather(*(one(name) for name in names), return_exceptions=True)
    return failures_by_shard(names, results)
