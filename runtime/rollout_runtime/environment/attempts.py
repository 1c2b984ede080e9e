"""Episode identity: one live attempt per ``episode_id``, fencing tokens, and the episodes already finished.

A redispatch can reach a server while the previous attempt of the same episode still runs there (its caller gave
up, its connection is closing, its cleanup is running). Two attempts of one episode would both run its steps and
race for its checkpoint, so a server admits one *live attempt* per episode id:

- a second attempt waits, up to ``duplicate_attempt_wait_seconds``, for the live one to end. A caller that
  disconnects cancels its attempt, so a redispatch after a lost connection waits only for that cancellation and
  its cleanup, then continues from whatever checkpoint the first left;
- if the live attempt still runs after the wait, the second is refused (409 ``episode_in_progress``, not
  terminal: the runtime retries it as an infra failure).

Each attempt carries a generation, its fencing token: only the live attempt of an id may export or drop the
episode's checkpoint, so an abandoned attempt never deletes or overwrites the state its successor owns.

A finished episode (a success or a terminal failure) is remembered with its result, a bounded number of them: a
later attempt with the same id and input gets that result again instead of running, or continuing, the episode a
second time. The memory is process-local; across a restart a finished episode's checkpoint is already gone (or,
if it could not be dropped, the store refuses to serve episodes until it is writable again).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Attempt", "EpisodeAttempts", "EpisodeInProgress"]

T = TypeVar("T")


@dataclass(eq=False)
class Attempt:
    """One attempt of an episode; ``generation`` orders the attempts this process has admitted."""

    episode_id: str
    generation: int
    ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def live(self) -> bool:
        """Whether this attempt still owns its episode (and so its checkpoint)."""
        return not self.ended.is_set()


class EpisodeInProgress(Exception):
    """Another attempt of this episode is still live after the wait: refused, retry later."""

    def __init__(self, episode_id: str, live_generation: int, waited_seconds: float) -> None:
        super().__init__(
            f"episode {episode_id!r} already has a live attempt (generation {live_generation}) on this server, "
            f"still running after waiting {waited_seconds:g}s for it to end; retry later"
        )
        self.episode_id = episode_id
        self.live_generation = live_generation


@dataclass(frozen=True)
class _Finished(Generic[T]):
    input_digest: str
    result: T


class EpisodeAttempts(Generic[T]):
    """The live attempt of every episode id, and the results of the last ``capacity`` finished episodes."""

    def __init__(self, *, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.waiting = 0
        """Attempts waiting for a previous attempt of their episode to end."""
        self._live: dict[str, Attempt] = {}
        self._finished: OrderedDict[str, _Finished[T]] = OrderedDict()
        self._generation = 0

    def live(self, episode_id: str) -> Attempt | None:
        return self._live.get(episode_id)

    def claim(self, episode_id: str) -> Attempt | None:
        """Make a new attempt the live one of ``episode_id``; None while another is live."""
        if episode_id in self._live:
            return None
        self._generation += 1
        attempt = self._live[episode_id] = Attempt(episode_id, self._generation)
        return attempt

    def release(self, attempt: Attempt) -> None:
        """The attempt ended. Releasing a stale attempt (not the live one) never evicts its successor."""
        attempt.ended.set()
        if self._live.get(attempt.episode_id) is attempt:
            del self._live[attempt.episode_id]

    async def acquire(self, episode_id: str, *, wait_seconds: float) -> Attempt:
        """Claim ``episode_id``, waiting up to ``wait_seconds`` for its live attempt to end.

        Raises :class:`EpisodeInProgress` if it is still live then.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while (attempt := self.claim(episode_id)) is None:
            current = self._live[episode_id]
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise EpisodeInProgress(episode_id, current.generation, wait_seconds)
            self.waiting += 1
            try:
                async with asyncio.timeout(remaining):
                    await current.ended.wait()
            except TimeoutError:
                raise EpisodeInProgress(episode_id, current.generation, wait_seconds) from None
            finally:
                self.waiting -= 1
        return attempt

    def finished(self, episode_id: str, input_digest: str) -> T | None:
        """The result of this episode if it already finished here with the same input, else None."""
        entry = self._finished.get(episode_id)
        if entry is None or entry.input_digest != input_digest:
            return None
        self._finished.move_to_end(episode_id)
        return entry.result

    def remember(self, episode_id: str, input_digest: str, result: T) -> None:
        """Remember a finished episode's result (the oldest is forgotten beyond ``capacity``)."""
        if self.capacity == 0:
            return
        self._finished[episode_id] = _Finished(input_digest, result)
        self._finished.move_to_end(episode_id)
        while len(self._finished) > self.capacity:
            self._finished.popitem(last=False)
