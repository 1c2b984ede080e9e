"""The trainer integrations in examples/trainers/, each run against real sim shard processes."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from types import ModuleType

import pytest

from rollout_runtime.sim import SimFleet
from rollout_runtime.sim.tokens import token_id
from support.deadlines import within
from support.tools import REPO_ROOT


def example(name: str) -> ModuleType:
    path = REPO_ROOT / "examples" / "trainers" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(2) as fleet:
        yield fleet


def endpoints(fleet: SimFleet) -> list[str]:
    return [shard.endpoint for shard in fleet.shards]


async def test_openai_shaped_client_returns_sdk_shaped_groups_with_token_ids(fleet: SimFleet) -> None:
    result = await within(example("openai_client").main(endpoints(fleet), fleet.model), "the OpenAI example")
    assert len(result["group"]) == 4
    for text, ids, logprobs in result["group"]:
        assert text == "42"
        assert ids == [token_id("42")]
        assert len(logprobs) == 1
    assert result["chat"] == "c b a"
    # token_ids=True asks vLLM for return_tokens_as_token_ids: logprob tokens are spelled token_id:<id>
    assert result["chat_tokens"] == [f"token_id:{token_id(w)}" for w in ("c", "b", "a")]
    assert result["shard"] in {"shard-0", "shard-1"}
    stats = result["stats"]
    assert (stats.submitted, stats.completed) == (2, 2)


async def test_nemo_rl_batch_generate_gives_token_ids_and_logprobs_per_sample(fleet: SimFleet) -> None:
    batch = await within(example("nemo_rl_generate").main(endpoints(fleet), fleet.model, count=8, n=2), "batch")
    assert len(batch.output_ids) == 16
    assert batch.failed == []
    assert all(batch.ok)
    assert batch.texts[:4] == ["0", "0", "4", "4"]  # prompt-major rows, n=2 per prompt
    assert batch.output_ids[2] == [token_id("4")]
    assert batch.generation_lengths == [len(ids) for ids in batch.output_ids]
    assert [len(lp) for lp in batch.logprobs] == batch.generation_lengths


async def test_verl_server_rollout_extends_the_context_turn_by_turn(fleet: SimFleet) -> None:
    outputs = await within(example("verl_rollout").main(endpoints(fleet), fleet.model, turns=3), "the verl loop")
    assert len(outputs) == 3
    # The sim shard echoes token-id prompts: each turn answers with the whole context so far (up to max_tokens).
    assert outputs[0].token_ids == [token_id(str(t)) for t in (101, 2054, 2003)]
    assert all(o.finish_reason in {"stop", "length"} and o.shard.startswith("shard-") for o in outputs)
    assert all(len(o.log_probs) == len(o.token_ids) for o in outputs)
