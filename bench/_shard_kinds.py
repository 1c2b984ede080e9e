"""What the failover benchmark needs to know about the shards it runs on, once per kind: what a good answer is, and
where the requests that reached the shards went (the ledger), read from the shards' own counters.

- ``sim``: the project's sim shards answer arithmetic (``What is 3 + 4?``) and ``reverse:`` prompts exactly, so an
  answer is good when it is the right one (:func:`~rollout_runtime.sim.expected_answer`), and each shard counts
  its requests by outcome on ``/admin/stats``: every ledger bucket is filled.
- ``vllm``: a real server's text cannot be checked (the tiny model's weights are random), so an answer is good when
  it is well-formed: finished by ``stop`` or ``length``, not empty, and its token counts agree with its ``usage``
  and the request's ``max_tokens``. A 200 that is not that (an ``abort`` with partial text, an empty or malformed
  body) passed on as a completion is corrupt. Every request asks ``ignore_eos`` so that each does the same work
  (``max_tokens`` tokens) whatever the random weights say. The ledger comes from vLLM's Prometheus ``/metrics``
  (:meth:`~rollout_runtime.vllm.fleet.VllmFleet.stats`); the buckets its counters cannot fill are ``n/a``
  (:data:`NA`), never estimated: see :func:`vllm_ledger`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from rollout_runtime.generation import Completion
from rollout_runtime.sim import expected_answer

NA: Final[float] = float("nan")
"""A ledger bucket or column the shards' counters cannot fill (printed ``n/a``)."""

LEDGER = ("useful", "duplicate", "refused", "errors", "malformed", "cut")
"""Where each request that reached a shard went: the committed answer; a completion nobody used (a retry's twin, an
answer the client had given up on); 429 at a concurrency cap; an error status; a 200 that was not a completion; cut
off or never answered (killed, hung, dropped, abandoned by the client). Read from the shards' own counters, so it is
the same ledger for every contender; the buckets add up to the requests that reached a shard."""

Judge = Callable[[str, Completion, int], "str | None"]
"""(prompt, completion passed on, max_tokens asked) -> why it is not a good answer, or None when it is one."""
Ledger = Callable[[Sequence[Mapping[str, int]], int], dict[str, float]]
"""(the shards' counters, prompts completed) -> the :data:`LEDGER` buckets."""


def _summed(counters: Sequence[Mapping[str, int]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for counter in counters:
        total.update(counter)
    return total


def sim_judge(prompt: str, completion: Completion, max_tokens: int) -> str | None:
    """The sim's answer is exact: anything else passed on as a completion is corrupt."""
    return None if completion.text.strip() == expected_answer(prompt) else f"answered {completion.text[:60]!r}"


def sim_ledger(counters: Sequence[Mapping[str, int]], completed: int) -> dict[str, float]:
    """The sim shards count every outcome themselves (``/admin/stats``), so every bucket is filled."""
    total = _summed(counters)
    refused = total["refused_at_cap"]
    errors = sum(v for k, v in total.items() if k.startswith("errors_")) - refused
    malformed = sum(v for k, v in total.items() if k.startswith("not_a_completion_"))
    unanswered = total["generation_requests"] - total["completions"] - errors - malformed - total["dropped"]
    useful = min(completed, total["completions"])
    return {
        "useful": useful,
        "duplicate": total["completions"] - useful,
        "refused": refused,
        "errors": errors,
        "malformed": malformed,
        "cut": total["dropped"] + max(0, unanswered),
    }


GOOD_FINISH: Final[frozenset[str]] = frozenset({"stop", "length"})


def vllm_judge(prompt: str, completion: Completion, max_tokens: int) -> str | None:
    """A real completion is good when it is well-formed; the first reason it is not, else None."""
    if completion.finish_reason not in GOOD_FINISH:
        return f"finish_reason {completion.finish_reason!r}"
    if not completion.text:
        return "empty text"
    usage = completion.usage
    if not 0 < completion.completion_tokens <= max_tokens:
        return f"{completion.completion_tokens} completion tokens for max_tokens {max_tokens}"
    if completion.finish_reason == "length" and completion.completion_tokens != max_tokens:
        return f"finished by length after {completion.completion_tokens} of {max_tokens} tokens"
    if completion.prompt_tokens <= 0 or usage.total_tokens != usage.prompt_tokens + usage.completion_tokens:
        return f"inconsistent usage {usage}"
    return None


def vllm_ledger(counters: Sequence[Mapping[str, int]], completed: int) -> dict[str, float]:
    """The buckets vLLM's own counters fill (``useful``, ``duplicate``, ``errors``); ``n/a`` for the rest:

    - ``refused``: vLLM has no concurrency cap to refuse at (it queues), and no counter of 429s it never sends;
    - ``malformed``: its only 200 that is not a completion is an ``abort`` (paused or shut down mid-request), which
      ``vllm:request_success_total{finished_reason="abort"}`` cannot tell from a request whose client went away;
    - ``cut``: a SIGKILLed server's in-flight requests die with its counters, and requests a frozen engine never
      answered are counted by nobody.

    ``duplicate`` also holds the rollout-fleet contenders' generate probes (1-token completions, sent only while no
    request completes on the shard). The vLLM-side request counts of each run are in the row's ``hits``.
    """
    total = _summed(counters)
    served = total["finished_stop"] + total["finished_length"]
    useful = min(completed, served)
    return {
        "useful": useful,
        "duplicate": served - useful,
        "refused": NA,
        "errors": total["http_4xx"] + total["http_5xx"],
        "malformed": NA,
        "cut": NA,
    }


def vllm_hits(counters: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """vLLM's own counts for a run, beside the ledger: requests it ended by abort, completion tokens generated."""
    total = _summed(counters)
    return {"aborted": total["finished_abort"], "generated_tokens": total["generation_tokens"]}


@dataclass(frozen=True)
class ShardKind:
    """One kind of shard: how the benchmark judges its answers and reads its counters."""

    name: str
    judge: Judge
    ledger: Ledger
    request_fields: Mapping[str, Any] = field(default_factory=dict)
    """Fields every contender's requests carry (the same for all of them)."""
    generate_probe: bool = False
    """Whether rollout-fleet's prober proves generation (``ProbeSettings.generate``): needed where ``/health`` is
    not liveness (a frozen vLLM engine keeps answering 200): what docs/health.md's generate probe is for."""
    hits: Callable[[Sequence[Mapping[str, int]]], dict[str, int]] = lambda counters: {}


SIM = ShardKind("sim", sim_judge, sim_ledger)
VLLM = ShardKind("vllm", vllm_judge, vllm_ledger, {"ignore_eos": True}, generate_probe=True, hits=vllm_hits)
KINDS: Final[dict[str, ShardKind]] = {kind.name: kind for kind in (SIM, VLLM)}


def is_na(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)
