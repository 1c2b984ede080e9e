"""A gray failure on real vLLM: a server reloaded in place with the other weight set answers 200 like its peers, and
only the trainer's signal tells it apart. The dispatcher quarantines it within a bounded number of its samples, and
its two peers never.

The dispatcher does not track weights here, so the whole fleet is one version to it (None): what a shard that loaded
the wrong checkpoint under the right version looks like. The trainer's mismatch is what NeMo-RL's
``token_mult_prob_error`` measures: the mean |logprob| difference, over a sample's tokens, between the shard's own
logprobs and a reference's (``prompt_logprobs`` of the same token ids on vllm-0, at the v1 weights).
"""

from __future__ import annotations

from typing import Any

import aiohttp

from rollout_runtime.dispatch import Completed, Dispatcher, DispatchEvent, DispatchPolicy, ShardQuarantined
from rollout_runtime.generation import GenerationClient, GenerationOptions
from rollout_runtime.results import Completion
from rollout_runtime.shards import Shard, StaticShardSource
from rollout_runtime.vllm import MODEL_NAME, VllmServer
from rollout_runtime.weights import vllm_reload_weights
from support.vllm import TinyModel, Victim

PROMPTS = 450
"""About 150 samples per server on average: the bound below, with room."""
BOUND = 150
"""The victim's samples before its quarantine. 32 are needed on each side before any test, from each of its two
peers, and a check runs every 25 observations (a sample and its mismatch are two), so a large shift is caught about
when the slowest peer has 32: vllm-0 also answers the trainer's reference requests, so it likely gets the least of
the rollouts. Measured: 94 at load 13 (the victim then held 94 mismatches, its peers 166 between them)."""
NO_EOS = {"ignore_eos": True}
"""The random model may sample its end-of-text token; a fixed length keeps every sample's mismatch over 8 tokens."""
POLICY = DispatchPolicy(
    backoff_initial_seconds=0.05, backoff_max_seconds=0.2, attempt_timeout_seconds=120, max_concurrency=6
)


def shard_of(server: VllmServer) -> Shard:
    return Shard(name=server.name, endpoint=server.url, model=MODEL_NAME)


async def mismatch(generation: GenerationClient, reference: Shard, completion: Completion) -> float:
    """Mean |rollout logprob - reference logprob| over the sample's tokens, the reference scoring the same ids."""
    prompt_ids, ids, logprobs = completion.prompt_token_ids, completion.token_ids, completion.logprobs
    assert prompt_ids is not None
    assert ids is not None
    assert logprobs is not None
    scored = await generation.complete(
        reference, [*prompt_ids, *ids], max_tokens=1, options=GenerationOptions(prompt_logprobs=1)
    )
    table = scored.prompt_logprobs
    assert table is not None
    differences = []
    for position, (token, rollout) in enumerate(zip(ids, logprobs, strict=True), start=len(prompt_ids)):
        row = table[position]
        assert row is not None
        assert token in row
        assert rollout is not None
        differences.append(abs(row[token] - rollout))
    return sum(differences) / len(differences)


async def test_a_server_on_the_other_weights_is_quarantined_on_the_trainers_mismatch(
    vllm_shared: list[VllmServer], vllm_victim_holder: Victim, tiny_vllm_model: TinyModel
) -> None:
    victim = await vllm_victim_holder.ensure_fresh()
    reference = shard_of(vllm_shared[0])
    events: list[DispatchEvent] = []
    options = GenerationOptions(logprobs=0, token_ids=True)
    source = StaticShardSource([shard_of(server) for server in (*vllm_shared, victim)])
    victim_samples = 0
    async with aiohttp.ClientSession() as http, GenerationClient(timeout_seconds=120) as generation:
        await vllm_reload_weights(http, victim.url, str(tiny_vllm_model.v2), 1)  # the wrong checkpoint, loaded in place
        vllm_victim_holder.mark_refit()  # the next test that needs base weights gets a fresh victim
        try:

            async def rollout(shard: Shard, prompt: int) -> Completion:
                extra: dict[str, Any] = NO_EOS | {"seed": prompt}
                text = f"the cat number {prompt} sat"
                return await generation.complete(
                    shard, text, max_tokens=8, temperature=1.0, options=options, extra=extra
                )

            async with Dispatcher(source, POLICY, observer=events.append) as dispatcher:
                async for outcome in dispatcher.run(range(PROMPTS), rollout):
                    assert isinstance(outcome, Completed), outcome
                    quarantined = any(isinstance(e, ShardQuarantined) for e in events)
                    if outcome.shard == victim.name and not quarantined:
                        victim_samples += 1
                    signal = await mismatch(generation, reference, outcome.result)
                    assert dispatcher.report_sample_quality(outcome.prompt_id, signal)
        finally:
            await vllm_reload_weights(http, victim.url, str(tiny_vllm_model.v1), 1)  # its own weights back
    quarantines = [e for e in events if isinstance(e, ShardQuarantined)]
    assert quarantines, f"{victim.name} served {victim_samples} samples on the wrong weights and was never quarantined"
    assert {q.shard for q in quarantines} == {victim.name}, "a server on the right weights was quarantined"
    first = quarantines[0]
    assert first.signal == "mismatch", first
    assert victim_samples <= BOUND, f"quarantined after {victim_samples} of its samples"
    assert first.evidence["mean"] > first.evidence["peer_mean"] + 0.3 * first.evidence["peer_sd"]
    assert set(first.peers) == {server.name for server in vllm_shared}
