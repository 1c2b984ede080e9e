"""Session affinity: the shard a session's requests go to while it is routable, by weighted rendezvous hashing.

Pure. Each (session key, shard name) pair gets a score; the session goes to the highest-scoring routable shard. When
that shard leaves the routable set (unhealthy, ejected) only its sessions move, each to its own next-best shard,
and they come back when it returns; no table to keep, and every router replica computes the same answer. The
weighted form (score ``weight / -ln(u)``, u the pair's hash in (0, 1)) gives each shard its weight's share of
sessions.

The dispatcher honours it: a prompt whose object has a non-empty ``affinity`` attribute is placed with
:func:`pick_affine` instead of least-loaded selection, with the same steering away from the shard that failed it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence
from typing import TypeVar

from rollout_runtime.dispatch.selection import ShardLoad

__all__ = ["affinity_key", "pick_affine", "rendezvous_score"]

L = TypeVar("L", bound=ShardLoad)

_SCALE = float(1 << 64)
"""Maps the 64-bit digest onto (0, 1), the uniform draw weighted rendezvous hashing needs."""


def rendezvous_score(key: str, name: str, weight: float = 1.0) -> float:
    """The weighted rendezvous score of shard ``name`` for session ``key`` (higher wins); stable across processes."""
    digest = hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest()
    unit = (int.from_bytes(digest, "big") + 0.5) / _SCALE  # in (0, 1), never 0 or 1
    return weight / -math.log(unit)


def affinity_key(prompt: object) -> str | None:
    """The session key a prompt carries (its ``affinity`` attribute), or None for no affinity."""
    key = getattr(prompt, "affinity", None)
    return key if isinstance(key, str) and key else None


def pick_affine(
    candidates: Sequence[L],
    key: str,
    *,
    last_failed: str | None = None,
    tried: Collection[str] = (),
) -> L | None:
    """The candidate with the highest rendezvous score for ``key``; None when there are none.

    As :func:`~rollout_runtime.dispatch.selection.pick_shard`: never the shard that failed this prompt last while
    another exists, then one not yet tried; among those, the session's own order decides, so a retry lands on the
    session's next shard rather than a random one.
    """
    best: L | None = None
    best_rank = (3, 0.0)
    for candidate in candidates:
        penalty = 2 if candidate.name == last_failed else 1 if candidate.name in tried else 0
        rank = (penalty, -rendezvous_score(key, candidate.name, candidate.weight))
        if best is None or rank < best_rank:
            best, best_rank = candidate, rank
    return best
