"""Batch generation for trainers: prompts in, token ids and logprobs out (NeMo-RL's ``generate`` shape), and a
verl-style server-rollout ``generate(prompt_ids, sampling_params, request_id)``.

Both run on the dispatcher: :func:`generate_batch` as one batch ``run()``, :class:`FleetGenerateServer` on a
long-lived session, so every request is retried elsewhere on infra failures and accounted for once. Token-level
fields come from the shards (vLLM's ``return_token_ids`` and ``logprobs``), never re-tokenised here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout_runtime.dispatch.engine import Dispatcher
from rollout_runtime.dispatch.outcomes import Completed
from rollout_runtime.dispatch.session import DispatchSession
from rollout_runtime.generation import GenerationClient
from rollout_runtime.results import Completion, GenerationOptions
from rollout_runtime.shards.model import Shard

__all__ = ["BatchGeneration", "FleetGenerateServer", "TokenOutput", "generate_batch"]


@dataclass
class BatchGeneration:
    """One row per prompt x sample (``n`` rows per prompt, prompt-major), as NeMo-RL's GenerationOutputSpec has them.

    ``failed`` lists the prompt indices that data-failed or were skipped; their rows are empty, ``ok`` False.
    """

    output_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    generation_lengths: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    ok: list[bool] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


def _rows(completion: Completion | None, n: int, out: BatchGeneration) -> None:
    choices = completion.choices if completion is not None else ()
    for index in range(n):
        choice = choices[index] if index < len(choices) else None
        ids = list(choice.token_ids or ()) if choice is not None else []
        out.output_ids.append(ids)
        out.logprobs.append([lp if lp is not None else 0.0 for lp in (choice.logprobs or ())] if choice else [])
        out.generation_lengths.append(len(ids))
        out.texts.append(choice.text if choice is not None else "")
        out.finish_reasons.append(choice.finish_reason if choice is not None else None)
        out.shards.append(completion.shard if completion is not None else "")
        out.ok.append(choice is not None)


async def generate_batch(
    dispatcher: Dispatcher,
    client: GenerationClient,
    prompts: Sequence[str | Sequence[int]],
    *,
    max_tokens: int = 64,
    temperature: float = 1.0,
    n: int = 1,
    stream: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> BatchGeneration:
    """Generate for every prompt (text or token ids) across the fleet; rows in prompt order."""
    options = GenerationOptions(n=n, logprobs=0, token_ids=True, stream=stream)

    async def rollout(shard: Shard, prompt: str | Sequence[int]) -> Completion:
        body = prompt if isinstance(prompt, str) else list(prompt)
        return await client.complete(
            shard,
            body,  # vLLM takes token ids as the prompt too
            max_tokens=max_tokens,
            temperature=temperature,
            extra=extra,
            options=options,
        )

    results: dict[int, Completion] = {}
    failed: list[int] = []
    async for outcome in dispatcher.run(prompts, rollout):
        index = int(outcome.prompt_id)
        if isinstance(outcome, Completed):
            results[index] = outcome.result
        else:
            failed.append(index)
    batch = BatchGeneration(failed=sorted(failed))
    for index in range(len(prompts)):
        _rows(results.get(index), n, batch)
    return batch


@dataclass(frozen=True)
class TokenOutput:
    """What a verl agent loop reads back from its server manager's ``generate``."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str | None
    shard: str
    weights_version: str | None


class FleetGenerateServer:
    """verl's server-rollout interface over the fleet: ``await server.generate(prompt_ids, sampling_params,
    request_id)``, each call one prompt of a dispatcher session (see docs/dispatch.md, "Generation results and
    trainer integrations").
    """

    def __init__(self, dispatcher: Dispatcher, client: GenerationClient, *, stream: bool = True) -> None:
        self._client = client
        self._stream = stream
        self.session: DispatchSession[tuple[list[int], dict[str, Any]], Completion] = dispatcher.session(
            self._rollout, drop_rules=False
        )

    async def _rollout(self, shard: Shard, request: tuple[list[int], dict[str, Any]]) -> Completion:
        prompt_ids, params = request
        params = dict(params)
        max_tokens = int(params.pop("max_tokens", params.pop("max_new_tokens", 64)))
        temperature = float(params.pop("temperature", 1.0))
        options = GenerationOptions(logprobs=0, token_ids=True, stream=self._stream)
        return await self._client.complete(
            shard,
            prompt_ids,
            max_tokens=max_tokens,
            temperature=temperature,
            extra=params,
            options=options,
        )

    async def generate(
        self, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any], request_id: str
    ) -> TokenOutput:
        """Generate for one tokenised prompt; raises RuntimeError if the fleet could not roll it out."""
        outcome = await self.session.submit((list(prompt_ids), dict(sampling_params)), prompt_id=request_id)
        if not isinstance(outcome, Completed):
            raise RuntimeError(f"request {request_id!r} failed after {outcome.attempts} attempt(s): {outcome.reason}")
        completion = outcome.result
        logprobs = [lp if lp is not None else 0.0 for lp in (completion.logprobs or ())]
        return TokenOutput(
            list(completion.token_ids or ()),
            logprobs,
            completion.finish_reason,
            completion.shard,
            completion.weights_version,
        )

    async def aclose(self) -> None:
        await self.session.aclose()
