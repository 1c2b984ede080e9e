"""Session affinity by weighted rendezvous hashing, and the dispatcher honouring it."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.dispatch import Dispatcher, DispatchPolicy
from rollout_runtime.dispatch.affinity import affinity_key, pick_affine, rendezvous_score
from rollout_runtime.dispatch.selection import ShardLoad
from rollout_runtime.shards.model import Shard, StaticShardSource


def loads(names: list[str]) -> list[ShardLoad]:
    return [ShardLoad(Shard(name=name, endpoint=f"http://127.0.0.1:{8000 + i}")) for i, name in enumerate(names)]


NAMES = st.lists(st.text("abcdefgh", min_size=1, max_size=6), min_size=2, max_size=8, unique=True)


@given(NAMES, st.text(min_size=1, max_size=20), st.randoms(use_true_random=False))
def test_a_session_keeps_its_shard_whatever_the_order_or_the_others_removed(
    names: list[str], key: str, rng: object
) -> None:
    """The pick depends on the set, not its order; removing a shard that is not the session's own moves nothing."""
    home = pick_affine(loads(names), key)
    assert home is not None
    shuffled = list(names)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    again = pick_affine(loads(shuffled), key)
    assert again is not None
    assert again.name == home.name
    for other in names:
        if other != home.name:
            kept = pick_affine(loads([n for n in names if n != other]), key)
            assert kept is not None
            assert kept.name == home.name


@given(NAMES, st.text(min_size=1, max_size=20))
def test_a_failed_shard_is_avoided_and_the_retry_goes_to_the_sessions_next_shard(names: list[str], key: str) -> None:
    home = pick_affine(loads(names), key)
    assert home is not None
    retry = pick_affine(loads(names), key, last_failed=home.name, tried=[home.name])
    without = pick_affine(loads([n for n in names if n != home.name]), key)
    assert retry is not None
    assert without is not None
    assert retry.name != home.name
    assert retry.name == without.name  # the same shard the session moves to if its own leaves


def test_weights_give_shards_their_share_of_sessions() -> None:
    counts = {"a": 0, "b": 0}
    for i in range(4000):
        counts[max(counts, key=lambda n: rendezvous_score(f"s{i}", n, 3.0 if n == "a" else 1.0))] += 1
    assert 0.7 < counts["a"] / 4000 < 0.8  # 3:1 weights -> about 75 %


def test_only_a_non_empty_string_attribute_is_a_session() -> None:
    @dataclass
    class Prompt:
        affinity: object

    assert affinity_key(Prompt("ep-1")) == "ep-1"
    assert affinity_key(Prompt("")) is None
    assert affinity_key(Prompt(7)) is None
    assert affinity_key("a plain prompt") is None


async def test_the_dispatcher_places_prompts_with_a_session_on_the_sessions_shard() -> None:
    @dataclass(frozen=True)
    class Prompt:
        affinity: str
        index: int

    shards = [Shard(name=f"shard-{i}", endpoint=f"http://127.0.0.1:{9000 + i}") for i in range(4)]
    seen: dict[int, str] = {}

    async def rollout(shard: Shard, prompt: Prompt) -> None:
        seen[prompt.index] = shard.name

    async with Dispatcher(StaticShardSource(shards), DispatchPolicy(max_concurrency=1)) as dispatcher:
        async for _ in dispatcher.run([Prompt("episode-42", i) for i in range(12)], rollout):
            pass

    home = max((s.name for s in shards), key=lambda name: rendezvous_score("episode-42", name))
    assert len(seen) == 12
    assert set(seen.values()) == {home}
