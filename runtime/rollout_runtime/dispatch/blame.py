"""Blame follows the evidence: per-run evidence on top of the per-attempt verdict, values in and a decision out.

:func:`~rollout_runtime.failures.diagnose` reads one failed attempt. That alone blames a poison prompt on the fleet
(llama.cpp answers a malformed request with 500 on every shard) and a sick fleet on the prompts (every shard answers
401). The evidence that tells them apart is which prompts and which shards one failure *signature* (taxonomy type,
HTTP status, normalised reason) follows:

- **backpressure**: 429, or 503 with a Retry-After. The shard is busy: go elsewhere, lower its share, never eject;
- **misconfigured fleet**: the signature is on every healthy shard, on at least two prompts, and nothing has
  succeeded anywhere since it first appeared: the run ends with an error that names it ("every shard answers 401
  Unauthorized: check the API key"). It must be on two shards, unless only one was ever seen: one shard answering
  404 while the others are out of the healthy set is one sick shard, not the fleet. Transient statuses (502, 503,
  504, 408, 425, 429) never qualify: an outage is what the infra budget and the healthy wait are for. An answer
  about the request's content (400, 413, 422, 500: too long, malformed) must also be on more failed attempts than
  there are attempts still in flight: at the start of a run nothing has succeeded yet, and three over-long prompts
  among the first hundred are three poison prompts, not a misconfigured fleet;
- **poison prompt**: the signature follows one prompt across at least two distinct shards, each of which has
  completed other prompts: DATA, with that evidence in the ledger, and no shard ejected for it. A prompt whose infra
  budget runs out on one non-transient answer from two or more shards is one too, by elimination
  (:meth:`Evidence.followed`): it failed before those shards had served anything. A transient status
  never convicts a prompt: two shards answering 503 at once are two bursts, not a poison prompt;
- **sick shard**: the signature follows one shard across at least two distinct prompts since its last success, and
  another shard has served a prompt this one failed that way: eject it, and a data charge it made to a prompt no
  longer counts (it never data-fails those prompts). Two poison prompts on one healthy shard are served nowhere, so
  they never make it "sick";
- **unconfirmed data**: a data verdict from an answer (400, 413, 422...) data-fails a prompt only when the shards
  that gave it serve other prompts and agree (:meth:`Evidence.confirmed`; the dispatcher checks the agreement);
  otherwise the answer may be the shards' (two of four answering 413 to everything), and the attempt is charged as
  infra instead;
- **this shard or this fleet is wrong** (401, 403, 404, 407): DATA by the first verdict, like any 4xx, but never the
  prompt's: such an answer never makes a prompt poison (not even by elimination) and confirms a data verdict only as
  the fleet's answer, once every shard met gave it to that prompt (a router relays it). So one shard answering it
  while others serve is a sick shard (its charges refunded), every shard answering it a misconfigured fleet;
- otherwise the first verdict stands, except that a shard which answered with a status that could be a poison
  prompt's or a misconfiguration's (:func:`waits_for_evidence`: 401, 404, 500, a 200 that is not a completion...) is
  not ejected on one failure: that waits for the evidence above. A transient status (502, 503, 504, 408, 425), a
  transport failure (refused, reset, timed out) and a 500 in which the server says its engine died (vLLM's
  "EngineCore encountered an issue": :func:`~rollout_runtime.http_verdicts.engine_dead`) still eject at once; such a
  500 is never a prompt's nor the fleet's configuration either.

Only failures that carry an HTTP status are weighed: an explicit :class:`RolloutDataFailure` without one is the
caller's own verdict and wins. Memory is bounded: a prompt's evidence is forgotten when it ends, per-shard and
per-signature sets are capped.
"""

from __future__ import annotations

import enum
import http
import re
from collections import OrderedDict
from collections.abc import Collection, Hashable
from dataclasses import dataclass, field
from typing import Final

from rollout_runtime.failures import Diagnosis, http_status_is_infra
from rollout_runtime.http_verdicts import SHARD_OR_FLEET, engine_dead

__all__ = ["Blame", "Evidence", "Signature", "Verdict", "judge", "signature", "waits_for_evidence"]

Signature = tuple[str, int, str]
"""(failure type, HTTP status, normalised reason): what one failure looks like, minus who answered it."""

_CONFIRMATIONS: Final[int] = 2
"""Distinct shards (poison) or distinct prompts (sick shard) a signature must follow before blame acts on it."""
_KEEP: Final[int] = 8
"""Members kept per evidence set: blame needs to count to two (or to the shard count), not to a million."""
_MAX_SIGNATURES: Final[int] = 256
"""Fleet-wide signatures remembered; the oldest is forgotten first."""
_TRANSIENT: Final[frozenset[int]] = frozenset({502, 503, 504, *(s for s in range(400, 500) if http_status_is_infra(s))})
"""Statuses that say "not now", never "never": the 4xx the first verdict retries (408, 425, 429) and a gateway's or a
busy server's 502, 503, 504. They cannot make a fleet misconfigured, nor a prompt poison."""
_ABOUT_THE_REQUEST: Final[frozenset[int]] = frozenset({400, 413, 422, 500})
"""Answers that a single prompt's content explains: fleet-wide only on more failed attempts than are in flight."""
_REASON_CHARS: Final[int] = 160
_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")

_HINTS: Final[dict[int, str]] = {
    200: "check that the endpoint is an OpenAI-compatible completions API",
    400: "check the request parameters",
    401: "check the API key",
    403: "check the API key's permissions",
    404: "check the endpoint URL and the model name",
    407: "check the proxy credentials",
    413: "check the server's request size limit",
    422: "check the request parameters",
    500: "check the request parameters and the server's log",
}


class Blame(enum.Enum):
    """What the evidence says about one failed attempt."""

    FIRST_VERDICT = "first_verdict"
    BACKPRESSURE = "backpressure"
    POISON = "poison"
    SICK_SHARD = "sick_shard"
    MISCONFIGURED = "misconfigured"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision, and the evidence behind it in words (for the ledger or the run-level error)."""

    blame: Blame
    evidence: str = ""


@dataclass(slots=True)
class _Sighting:
    shards: set[str] = field(default_factory=set)
    prompts: set[Hashable] = field(default_factory=set)
    successes_before: int = 0
    failures: int = 0


@dataclass(slots=True)
class Evidence:
    """What a dispatcher has seen: successes per shard, each shard's failures since its last success, each unfinished
    prompt's failures, and which shards and prompts each signature has been on."""

    successes: dict[str, int] = field(default_factory=dict)
    total_successes: int = 0
    streaks: dict[str, dict[Signature, set[Hashable]]] = field(default_factory=dict)
    prompts: dict[Hashable, dict[Signature, set[str]]] = field(default_factory=dict)
    fleet: OrderedDict[Signature, _Sighting] = field(default_factory=OrderedDict)
    sick: set[tuple[str, Signature]] = field(default_factory=set)
    exonerated: dict[str, dict[Signature, int]] = field(default_factory=dict)
    """Per shard, since its last success: prompts it failed with a signature that another shard then served."""
    seen: set[str] = field(default_factory=set)
    """Shards this evidence has met (healthy at a failure, or serving), up to a few: is the fleet one shard?"""

    def succeeded(self, shard: str, prompt: Hashable) -> None:
        """``prompt`` succeeded on ``shard``: that shard's failure streak ends and it counts as serving; every other
        shard that failed this prompt is one step closer to being judged sick for how it failed."""
        self.successes[shard] = self.successes.get(shard, 0) + 1
        self.total_successes += 1
        _add(self.seen, shard)
        self.streaks.pop(shard, None)
        self.exonerated.pop(shard, None)
        for sig, shards in self.prompts.pop(prompt, {}).items():
            for other in shards:
                if other != shard:
                    counts = self.exonerated.setdefault(other, {})
                    counts[sig] = counts.get(sig, 0) + 1

    def followed(self, prompt: Hashable, sig: Signature | None) -> bool:
        """Whether this non-transient answer is the only one ``prompt`` got, from at least two distinct shards: when
        its infra budget runs out that way, the prompt is the common factor (a poison prompt by elimination)."""
        if sig is None or not _could_be_the_prompts(sig):
            return False
        failures = self.prompts.get(prompt, {})
        return set(failures) == {sig} and len(failures[sig]) >= _CONFIRMATIONS

    def confirmed(self, prompt: Hashable, sig: Signature) -> bool:
        """Whether a data verdict on ``prompt`` may stand: every shard that gave this answer has served other prompts
        (or no shard has served anything yet: there is nothing to compare with). A shard that serves nothing while
        others serve may be answering everything that way (two of four shards answering 413), so its answer alone
        does not convict a prompt. An answer about the shard or the fleet (401, 404...) never convicts one: it stands
        only as the fleet's answer, once every shard met has given it to this prompt (a router relays it as it came)."""
        shards = self.prompts.get(prompt, {}).get(sig, set())
        if sig[1] in SHARD_OR_FLEET:
            return bool(shards) and shards.issuperset(self.seen)
        return self.total_successes == 0 or all(self.successes.get(name, 0) > 0 for name in shards)

    def forget(self, prompt: Hashable) -> None:
        """The prompt has its outcome: its evidence is no longer needed."""
        self.prompts.pop(prompt, None)

    def judged_sick(self, shard: str, sig: Signature) -> bool:
        """Whether ``shard`` was judged sick for ``sig`` (a data charge it made does not count against a prompt)."""
        return (shard, sig) in self.sick


def signature(diagnosis: Diagnosis, shard: str, endpoint: str) -> Signature | None:
    """The failure's signature, or None for one that carries no HTTP status (nothing for blame to weigh).

    The reason is normalised so that the same answer from two shards matches: the shard's name and endpoint go, digits
    become ``#`` (ports, token counts, request ids), case and whitespace are folded.
    """
    if diagnosis.status is None:
        return None
    reason = diagnosis.reason
    if endpoint:
        reason = reason.replace(endpoint, "<endpoint>")
    reason = reason.replace(f"shard {shard}", "shard <shard>")
    if len(shard) >= 3:  # a whole-word name; a one-letter name would eat letters out of words
        reason = re.sub(rf"(?<![\w.-]){re.escape(shard)}(?![\w-])", "<shard>", reason)
    reason = _SPACE.sub(" ", _DIGITS.sub("#", reason)).strip().lower()[:_REASON_CHARS]
    return (diagnosis.failure_type, diagnosis.status, reason)


def waits_for_evidence(sig: Signature | None) -> bool:
    """Whether a failure with this signature ejects its shard only on evidence (not at once): it carries a status that
    a poison prompt or a misconfigured fleet could explain. Transient statuses cannot, and eject at once as before."""
    return sig is not None and sig[1] not in _TRANSIENT and not _the_shards_own(sig)


def _the_shards_own(sig: Signature) -> bool:
    """An answer in which the shard says it is broken (its engine died): not the prompt's, not the fleet's."""
    return engine_dead(sig[1], sig[2])


def _could_be_the_prompts(sig: Signature) -> bool:
    """Whether an answer could be the prompt's: not "not now" (transient), not "this shard or this fleet is wrong",
    not the shard saying it is broken."""
    return sig[1] not in _TRANSIENT and sig[1] not in SHARD_OR_FLEET and not _the_shards_own(sig)


def _add(members: set[Hashable] | set[str], member: Hashable) -> None:
    if len(members) < _KEEP:
        members.add(member)  # type: ignore[arg-type]


def _answers(sig: Signature) -> str:
    status = sig[1]
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    hint = _HINTS.get(status) or _HINTS[400 if status < 500 else 500]
    answered = f"{status} {phrase}".strip() if status != 200 else "200 with a body that is not a completion"
    return f"every shard answers {answered}: {hint}"


def judge(
    evidence: Evidence,
    *,
    prompt: Hashable,
    shard: str,
    sig: Signature,
    diagnosis: Diagnosis,
    healthy: Collection[str],
    in_flight: int = 0,
) -> Verdict:
    """Record one failed attempt that carries an HTTP status and decide what the evidence says (see the module doc).

    ``healthy`` is the healthy set (ejected shards included): a misconfiguration has to be on all of it;
    ``in_flight`` the attempts still running, which an answer about the request's content has to outnumber.
    """
    if diagnosis.backpressure:
        return Verdict(Blame.BACKPRESSURE, f"shard {shard} is busy (HTTP {diagnosis.status})")
    streak = evidence.streaks.setdefault(shard, {}).setdefault(sig, set())
    _add(streak, prompt)
    on_shards = evidence.prompts.setdefault(prompt, {}).setdefault(sig, set())
    _add(on_shards, shard)
    sighting = evidence.fleet.get(sig)
    if sighting is None:
        sighting = evidence.fleet[sig] = _Sighting(successes_before=evidence.total_successes)
        if len(evidence.fleet) > _MAX_SIGNATURES:
            evidence.fleet.popitem(last=False)
    sighting.shards.add(shard)
    sighting.failures += 1
    _add(sighting.prompts, prompt)
    for name in healthy:
        if len(evidence.seen) >= _KEEP:
            break
        evidence.seen.add(name)

    status = sig[1]
    if (
        status not in _TRANSIENT
        and not _the_shards_own(sig)
        and (status < 500 or status in (500, 501))
        and healthy
        and sighting.shards.issuperset(healthy)
        and len(sighting.shards) >= min(_CONFIRMATIONS, len(evidence.seen))
        and len(sighting.prompts) >= _CONFIRMATIONS
        and evidence.total_successes == sighting.successes_before
        and (status not in _ABOUT_THE_REQUEST or sighting.failures > in_flight)
    ):
        shards = len(sighting.shards)
        return Verdict(
            Blame.MISCONFIGURED,
            f"{_answers(sig)} ({shards} shard(s), {len(sighting.prompts)}+ prompts, nothing succeeded since; "
            f"last: {diagnosis.reason})",
        )
    serving = [name for name in sorted(on_shards) if evidence.successes.get(name, 0) > 0]
    if len(serving) >= _CONFIRMATIONS and _could_be_the_prompts(sig):  # bursts on two shards at once are no poison
        return Verdict(
            Blame.POISON,
            f"poison prompt: the same failure (HTTP {status}) on {len(serving)} shards ({', '.join(serving)}) that "
            "completed other prompts",
        )
    served_elsewhere = evidence.exonerated.get(shard, {}).get(sig, 0)
    if len(streak) >= _CONFIRMATIONS and served_elsewhere and len(healthy) > 1:
        evidence.sick.add((shard, sig))
        return Verdict(
            Blame.SICK_SHARD,
            f"shard {shard} failed {len(streak)} distinct prompts the same way (HTTP {status}) since its last success",
        )
    return Verdict(Blame.FIRST_VERDICT)
