"""In-process fakes for dispatcher tests: shards, a shard source the test drives, scripted rollouts.

No servers and no sleeps: a test publishes healthy sets and scripts what each attempt does; anything that must
wait (a hung attempt) waits on a future the test or the dispatcher resolves.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout_runtime.dispatch import Completed, DataFailed, DispatchRun, Outcome, Skipped
from rollout_runtime.shards import HealthySet, Shard
from support.deadlines import deadline


def make_shard(name: str, weight: float = 1.0) -> Shard:
    return Shard(name=name, endpoint=f"http://{name}.test:8000", weight=weight)


def make_shards(*names: str) -> list[Shard]:
    return [make_shard(name) for name in names]


class ControlledSource:
    """A ShardSource whose snapshots the test publishes; ``end()`` ends the stream (the last one stays in force)."""

    def __init__(self, shards: Iterable[Shard] | None = None) -> None:
        self._queue: asyncio.Queue[HealthySet | None] = asyncio.Queue()
        self.closed = asyncio.Event()
        if shards is not None:
            self.publish(shards)

    def publish(self, shards: Iterable[Shard], probe_ok_at: Mapping[str, float] | None = None) -> HealthySet:
        snapshot = HealthySet.of(shards, probe_ok_at)
        self._queue.put_nowait(snapshot)
        return snapshot

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def snapshots(self) -> AsyncIterator[HealthySet]:
        try:
            while (snapshot := await self._queue.get()) is not None:
                yield snapshot
        finally:
            self.closed.set()


@dataclass
class AttemptLog:
    """Every attempt a fake rollout saw: (prompt, shard name) in order."""

    calls: list[tuple[Any, str]] = field(default_factory=list)

    def per_prompt(self) -> Counter[Any]:
        return Counter(prompt for prompt, _ in self.calls)

    def shards_for(self, prompt: Any) -> list[str]:
        return [shard for p, shard in self.calls if p == prompt]


def echo_rollout(log: AttemptLog | None = None) -> Callable[[Shard, Any], Any]:
    """A rollout that succeeds at once with ``(prompt, shard name)``."""

    async def rollout(shard: Shard, prompt: Any) -> tuple[Any, str]:
        if log is not None:
            log.calls.append((prompt, shard.name))
        return prompt, shard.name

    return rollout


def _run_state(run: DispatchRun[Any, Any], outcomes: list[Outcome[Any, Any]]) -> Callable[[], str]:
    return lambda: f"the run to end ({len(outcomes)} outcomes delivered; {run.stats})"


async def collect(run: DispatchRun[Any, Any], *, seconds: float | None = None) -> list[Outcome[Any, Any]]:
    """Every outcome of the run; a run that stops delivering fails the test (see :func:`support.deadlines.deadline`)."""
    outcomes: list[Outcome[Any, Any]] = []
    async with deadline(_run_state(run, outcomes), seconds):
        async for outcome in run:
            outcomes.append(outcome)
    return outcomes


async def collect_until_error(
    run: DispatchRun[Any, Any], *, seconds: float | None = None
) -> tuple[list[Outcome[Any, Any]], BaseException | None]:
    """The outcomes a run delivered before it raised, and what it raised (None if it ended normally)."""
    outcomes: list[Outcome[Any, Any]] = []
    async with deadline(_run_state(run, outcomes), seconds):
        try:
            async for outcome in run:
                outcomes.append(outcome)
        except Exception as exc:
            return outcomes, exc
    return outcomes, None


def by_kind(outcomes: Iterable[Outcome[Any, Any]]) -> dict[str, list[Any]]:
    kinds: dict[str, list[Any]] = {"completed": [], "data_failed": [], "skipped": []}
    for outcome in outcomes:
        if isinstance(outcome, Completed):
            kinds["completed"].append(outcome)
        elif isinstance(outcome, DataFailed):
            kinds["data_failed"].append(outcome)
        elif isinstance(outcome, Skipped):
            kinds["skipped"].append(outcome)
        else:  # pragma: no cover - the union is closed
            raise AssertionError(f"unexpected outcome {outcome!r}")
    return kinds


def assert_accounted(run: DispatchRun[Any, Any], outcomes: list[Outcome[Any, Any]], prompt_ids: Iterable[Any]) -> None:
    """The accounting invariant: every prompt exactly once, as an outcome or as aborted by a run that raised."""
    ids = list(prompt_ids)
    delivered = [outcome.prompt_id for outcome in outcomes]
    assert len(delivered) == len(set(delivered)), f"duplicated outcomes: {Counter(delivered).most_common(3)}"
    aborted = run.aborted_ids()
    assert not set(delivered) & set(aborted), "a prompt both delivered and aborted"
    assert sorted(map(str, delivered + aborted)) == sorted(map(str, ids)), "a prompt was lost"
    stats = run.stats
    kinds = by_kind(outcomes)
    assert stats.completed == len(kinds["completed"])
    assert stats.data_failed == len(kinds["data_failed"])
    assert stats.skipped == len(kinds["skipped"])
    assert stats.aborted == len(aborted)
    assert stats.submitted == stats.completed + stats.data_failed + stats.skipped + stats.aborted
    assert stats.in_flight == 0
    for failed in kinds["data_failed"]:
        assert failed.reason, f"data failure without a reason: {failed!r}"
