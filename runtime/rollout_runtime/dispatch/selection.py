"""Shard selection: weighted least outstanding requests, steering retries away from the shards that failed.

Pure: takes the candidates' current load and returns a choice. One pass over the eligible shards per attempt
(O(shards), no allocation on the common path): fleets are tens to hundreds of shards, and a heap would have to
be re-keyed on every attempt start and finish, which costs more than the scan it saves.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rollout_runtime.shards.model import Shard

__all__ = ["ShardLoad", "pick_shard"]

L = TypeVar("L", bound="ShardLoad")


@dataclass(slots=True, eq=False)
class ShardLoad:
    """A shard and the attempts this runtime currently has in flight on it."""

    shard: Shard
    outstanding: int = 0
    name: str = field(init=False)
    weight: float = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.shard.name
        self.weight = self.shard.weight


def pick_shard(
    candidates: Sequence[L],
    *,
    start: int = 0,
    last_failed: str | None = None,
    tried: Collection[str] = (),
) -> L | None:
    """Choose the candidate with the lowest ``outstanding / weight``; None when there are no candidates.

    Preference, strongest first: never the shard that failed this prompt last while any other candidate
    exists; then a shard not yet tried for this prompt; then the lowest weighted load. Ties go to the first
    candidate at or after ``start`` (wrapping), so a caller that advances ``start`` on every pick gets
    round-robin among equally loaded shards, deterministically.
    """
    count = len(candidates)
    if count == 0:
        return None
    best: L | None = None
    best_penalty = 3
    best_load = 0.0
    check = last_failed is not None or bool(tried)
    for offset in range(count):
        candidate = candidates[(start + offset) % count]
        penalty = 0
        if check:
            if candidate.name == last_failed:
                penalty = 2
            elif candidate.name in tried:
                penalty = 1
        load = candidate.outstanding / candidate.weight
        if penalty < best_penalty or (penalty == best_penalty and load < best_load):
            best, best_penalty, best_load = candidate, penalty, load
    return best
