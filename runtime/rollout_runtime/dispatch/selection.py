"""Shard selection: weighted least outstanding requests, steering retries away from the shards that failed.

Pure: takes the candidates' current load and returns a choice. Two regimes, one rule ("lowest outstanding /
weight, never the shard that just failed this prompt while another exists, untried before tried"):

- up to :data:`EXACT_SCAN_MAX` candidates, an exact scan: the least loaded shard, ties round-robin from ``start``;
- beyond, power-of-two-choices (Envoy's least-request balancer; Mitzenmacher's result that two random choices
  give an exponentially better maximum load than one): a few candidates drawn with probability proportional to
  their weight, the least loaded of them. Cost per attempt no longer grows with the fleet; the draws are a
  deterministic function of ``start``, so a caller that advances it gets reproducible choices.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

from rollout_runtime.shards.model import Shard

__all__ = ["EXACT_SCAN_MAX", "ShardLoad", "pick_shard"]

L = TypeVar("L", bound="ShardLoad")

EXACT_SCAN_MAX: Final[int] = 8
"""Fleets up to this size are scanned exactly: a scan of that many candidates costs about what the draws and the
bisections of sampling cost, and it gives the exact least-loaded shard."""
_DRAWS: Final[int] = 2
"""Power of two choices: going from one draw to two gives the exponentially better maximum load; more draws improve it
by a constant factor only, and steer concurrent picks onto the same least-loaded shard."""
_EXTRA_DRAWS: Final[int] = 4
"""Further draws, one at a time, while every drawn candidate is one this prompt already tried. While a prompt has tried
at most half the fleet, each draw finds an untried shard with probability at least one half, so four leave at most a
1 in 16 chance of settling for a tried one, at a cost per attempt that stays bounded."""
_MASK: Final[int] = (1 << 64) - 1
"""Keeps splitmix64's arithmetic in 64 bits, as its constants assume."""


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


def _load(candidate: ShardLoad) -> float:
    """The one definition of a candidate's load (what a backpressure signal would scale)."""
    return candidate.outstanding / candidate.weight


def pick_shard(
    candidates: Sequence[L],
    *,
    start: int = 0,
    last_failed: str | None = None,
    tried: Collection[str] = (),
) -> L | None:
    """Choose the candidate with the lowest ``outstanding / weight``; None when there are no candidates.

    Preference, strongest first: never the shard that failed this prompt last while any other candidate
    exists; then a shard not yet tried for this prompt; then the lowest weighted load. Up to
    :data:`EXACT_SCAN_MAX` candidates the choice is exact and ties go to the first candidate at or after
    ``start`` (wrapping), so advancing ``start`` on every pick gives round-robin among equally loaded shards.
    Beyond, it is the best of weighted random draws seeded by ``start`` (see the module docstring).
    """
    count = len(candidates)
    if count == 0:
        return None
    if count <= EXACT_SCAN_MAX:
        return _scan(candidates, start, last_failed, tried)
    return _two_choices(candidates, start, last_failed, tried)


def _scan(candidates: Sequence[L], start: int, last_failed: str | None, tried: Collection[str]) -> L:
    count = len(candidates)
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
        load = _load(candidate)
        if penalty < best_penalty or (penalty == best_penalty and load < best_load):
            best, best_penalty, best_load = candidate, penalty, load
    assert best is not None
    return best


class _Weights:
    """Cumulative weights of the last candidate list seen (the engine rebuilds its list when the fleet changes,
    so one entry, checked by identity and length, serves every pick in between)."""

    __slots__ = ("candidates", "cumulative", "equal", "total")

    def __init__(self) -> None:
        self.candidates: Sequence[ShardLoad] | None = None
        self.cumulative: list[float] = []
        self.total = 0.0
        self.equal = True

    def of(self, candidates: Sequence[ShardLoad]) -> _Weights:
        if self.candidates is not candidates or len(self.cumulative) != len(candidates):
            running = 0.0
            cumulative = []
            for candidate in candidates:
                running += candidate.weight
                cumulative.append(running)
            first = candidates[0].weight
            self.candidates, self.cumulative, self.total = candidates, cumulative, running
            self.equal = all(c.weight == first for c in candidates)
        return self


_WEIGHTS = _Weights()


def _mix(value: int) -> int:
    """splitmix64: a well-spread 64-bit value from a counter."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def _two_choices(candidates: Sequence[L], start: int, last_failed: str | None, tried: Collection[str]) -> L:
    count = len(candidates)
    weights = _WEIGHTS.of(candidates)
    if weights.equal and last_failed is None and not tried:  # a first attempt on a uniform fleet: two draws
        bits = _mix(start)
        first, second = candidates[bits % count], candidates[(bits >> 32) % count]
        return first if first.outstanding <= second.outstanding else second
    best: L | None = None
    best_penalty = 3
    best_load = 0.0
    seed = start * (_DRAWS + _EXTRA_DRAWS)
    for draw in range(_DRAWS + _EXTRA_DRAWS):
        if draw >= _DRAWS and best_penalty == 0:
            break
        bits = _mix(seed + draw)
        if weights.equal:
            index = bits % count
        else:
            point = (bits >> 11) * (1.0 / (1 << 53)) * weights.total
            index = min(count - 1, bisect.bisect_right(weights.cumulative, point))
        candidate = candidates[index]
        penalty = 2 if candidate.name == last_failed else 1 if candidate.name in tried else 0
        load = _load(candidate)
        if penalty < best_penalty or (penalty == best_penalty and load < best_load):
            best, best_penalty, best_load = candidate, penalty, load
    assert best is not None
    if best_penalty == 2:  # every draw hit the shard that just failed: any other one will do
        index = candidates.index(best)
        best = candidates[(index + 1) % count]
    return best
