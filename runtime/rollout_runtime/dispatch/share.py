"""A shard's share of new attempts under backpressure: data the selection reads, never a reason to eject.

A shard that answers 429 (or 503 with a Retry-After) is busy, not broken. Its *share* halves on each such answer,
down to a floor, and grows back by a step on each success (additive increase, multiplicative decrease, as TCP and
Envoy's adaptive concurrency do). The dispatcher multiplies a shard's configured weight by its share, and the
selection (``selection.py``) reads that weight as it always has: no other change there. Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = ["MIN_SHARE", "Shares"]

MIN_SHARE: Final[float] = 1 / 16
"""A busy shard keeps some traffic, so its recovery is seen: four halvings (four 429s in a row) reach it, and a
sixteenth of a shard's weight is still at least one attempt in any wave the size of the fleet's concurrency."""
_RECOVERY_STEP: Final[float] = 1 / 8
"""Additive increase: eight successes bring a shard at the floor back to its full share, so one 429 costs a shard
less traffic than it takes successes to earn back (halving is a larger step than the increase, as AIMD needs to
converge on the shard's capacity instead of oscillating around it)."""


@dataclass(slots=True)
class Shares:
    """Each shard's share in (0, 1]; a shard never named has the full share."""

    _shares: dict[str, float] = field(default_factory=dict)

    def of(self, shard: str) -> float:
        return self._shares.get(shard, 1.0)

    def busy(self, shard: str) -> float:
        """The shard answered with backpressure: halve its share (not below :data:`MIN_SHARE`); return it."""
        share = max(MIN_SHARE, self.of(shard) / 2)
        self._shares[shard] = share
        return share

    def served(self, shard: str) -> float:
        """The shard completed an attempt: grow its share back by one step; return it."""
        share = self._shares.get(shard)
        if share is None:
            return 1.0
        share = min(1.0, share + _RECOVERY_STEP)
        if share >= 1.0:
            del self._shares[shard]
        else:
            self._shares[shard] = share
        return share

    def forget(self, shard: str) -> None:
        """The shard left the fleet."""
        self._shares.pop(shard, None)
