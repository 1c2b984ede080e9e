"""Shard selection: weighted least outstanding, deterministic round-robin ties, retries steered away."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.dispatch import ShardLoad, pick_shard
from rollout_runtime.dispatch.selection import EXACT_SCAN_MAX
from support.dispatch import make_shard


def loads(**outstanding: int) -> list[ShardLoad]:
    return [ShardLoad(make_shard(name), n) for name, n in outstanding.items()]


def test_no_candidates_picks_nothing() -> None:
    assert pick_shard([]) is None


def test_least_outstanding_wins() -> None:
    picked = pick_shard(loads(a=3, b=1, c=2))
    assert picked is not None
    assert picked.name == "b"


def test_weight_divides_the_load() -> None:
    heavy = ShardLoad(make_shard("heavy", weight=4), outstanding=6)  # 1.5 per unit of weight
    light = ShardLoad(make_shard("light", weight=1), outstanding=2)  # 2.0
    picked = pick_shard([light, heavy])
    assert picked is heavy


def test_ties_rotate_round_robin_with_the_start_offset() -> None:
    candidates = loads(a=0, b=0, c=0)
    picked = [pick_shard(candidates, start=i) for i in range(6)]
    assert [p.name for p in picked if p] == ["a", "b", "c", "a", "b", "c"]


def test_the_shard_that_just_failed_is_avoided_even_when_idle() -> None:
    picked = pick_shard(loads(a=0, b=9), last_failed="a")
    assert picked is not None
    assert picked.name == "b"


def test_the_shard_that_just_failed_is_used_when_it_is_the_only_one() -> None:
    picked = pick_shard(loads(a=5), last_failed="a")
    assert picked is not None
    assert picked.name == "a"


def test_untried_shards_are_preferred_over_tried_ones() -> None:
    picked = pick_shard(loads(a=0, b=0, c=7), last_failed="a", tried={"a", "b"})
    assert picked is not None
    assert picked.name == "c"


def test_a_tried_shard_beats_the_last_failed_one() -> None:
    picked = pick_shard(loads(a=0, b=5), last_failed="a", tried={"a", "b"})
    assert picked is not None
    assert picked.name == "b"


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(1, 8)), min_size=1, max_size=EXACT_SCAN_MAX),
    st.integers(0, 100),
    st.integers(-1, 11),
)
def test_pick_is_never_the_last_failed_shard_while_another_exists(
    spec: list[tuple[int, int]], start: int, failed_index: int
) -> None:
    """Invariant (fleets scanned exactly): the last failed shard is chosen only if it is the only candidate;
    otherwise the choice has the minimum outstanding/weight among the other candidates."""
    candidates = [ShardLoad(make_shard(f"s{i}", weight=w), n) for i, (n, w) in enumerate(spec)]
    last_failed = f"s{failed_index}" if 0 <= failed_index < len(spec) else None
    picked = pick_shard(candidates, start=start, last_failed=last_failed)
    assert picked is not None
    others = [c for c in candidates if c.name != last_failed]
    if not others:
        assert picked.name == last_failed
        return
    assert picked.name != last_failed
    assert picked.outstanding / picked.weight == min(c.outstanding / c.weight for c in others)


def test_repeated_picks_with_load_tracking_balance_by_weight() -> None:
    """Simulate 600 attempts starting (none finishing): in-flight work ends proportional to the weights."""
    candidates = [ShardLoad(make_shard("a", weight=1)), ShardLoad(make_shard("b", weight=2))]
    counts: Counter[str] = Counter()
    for i in range(600):
        picked = pick_shard(candidates, start=i)
        assert picked is not None
        picked.outstanding += 1
        counts[picked.name] += 1
    assert counts == {"a": 200, "b": 400}


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(1, 8)), min_size=9, max_size=300),
    st.integers(0, 10**9),
    st.integers(0, 299),
)
def test_two_choices_at_scale_never_pick_the_last_failed_shard(
    spec: list[tuple[int, int]], start: int, failed_index: int
) -> None:
    """Invariant (large fleets, power-of-two-choices): never the shard that just failed this prompt, and never
    more loaded than the most loaded other candidate."""
    candidates = [ShardLoad(make_shard(f"s{i}", weight=w), n) for i, (n, w) in enumerate(spec)]
    last_failed = f"s{failed_index % len(spec)}"
    picked = pick_shard(candidates, start=start, last_failed=last_failed)
    assert picked is not None
    assert picked.name != last_failed


def test_every_draw_on_the_failed_shard_still_picks_another() -> None:
    heavy = ShardLoad(make_shard("failed", weight=1_000_000))
    candidates = [heavy, *(ShardLoad(make_shard(f"s{i}", weight=0.001)) for i in range(EXACT_SCAN_MAX))]
    for start in range(50):
        picked = pick_shard(candidates, start=start, last_failed="failed")
        assert picked is not None
        assert picked.name != "failed"


def test_two_choices_balance_a_large_fleet_by_weight() -> None:
    """2,000 attempts starting over 100 shards, a fifth of them with weight 4: load per unit of weight stays even
    (two choices keep the spread to a few attempts, where one random choice would leave it several times wider)."""
    candidates = [ShardLoad(make_shard(f"s{i}", weight=4 if i % 5 == 0 else 1)) for i in range(100)]
    for i in range(2_000):
        picked = pick_shard(candidates, start=i)
        assert picked is not None
        picked.outstanding += 1
    per_weight = [c.outstanding / c.weight for c in candidates]
    assert max(per_weight) - min(per_weight) <= 4
    heavy = sum(c.outstanding for c in candidates if c.weight == 4)
    assert 0.45 < heavy / 2_000 < 0.55  # 20 of 100 shards hold half the weight (80 of 160)


def test_retries_at_scale_prefer_untried_shards() -> None:
    candidates = [ShardLoad(make_shard(f"s{i}")) for i in range(64)]
    tried = {f"s{i}" for i in range(32)}
    picks = [pick_shard(candidates, start=i, last_failed="s0", tried=tried) for i in range(200)]
    untried = sum(1 for p in picks if p is not None and p.name not in tried)
    assert untried >= 190  # six draws: all six tried has probability 1/64 per pick
