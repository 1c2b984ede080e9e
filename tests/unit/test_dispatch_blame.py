"""Blame follows the evidence: one test per rule of dispatch/blame.py, values in and a verdict out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime.dispatch.blame import Blame, Evidence, Signature, judge, signature, waits_for_evidence
from rollout_runtime.dispatch.share import MIN_SHARE, Shares
from rollout_runtime.failures import Diagnosis, FailureClass, http_status_is_infra

SHARDS = ("a", "b", "c", "d")


def diag(
    status: int | None, reason: str = "boom", *, infra: bool | None = None, retry_after: float | None = None
) -> Diagnosis:
    """A failed attempt's diagnosis; its class is the status's first verdict unless ``infra`` says otherwise."""
    if infra is None:
        infra = status is None or http_status_is_infra(status)
    return Diagnosis(
        failure_class=FailureClass.INFRA if infra else FailureClass.DATA,
        failure_type="GenerationUnavailable" if infra else "RolloutDataFailure",
        blames_shard=infra,
        terminal=False,
        reason=reason,
        status=status,
        retry_after=retry_after,
    )


def fail(
    evidence: Evidence, prompt: int, shard: str, d: Diagnosis, healthy: tuple[str, ...] = SHARDS, in_flight: int = 0
) -> Blame:
    sig = signature(d, shard, f"http://{shard}:8000")
    assert sig is not None
    return judge(evidence, prompt=prompt, shard=shard, sig=sig, diagnosis=d, healthy=healthy, in_flight=in_flight).blame


def test_answers_about_the_request_are_fleet_wide_only_on_more_attempts_than_are_in_flight() -> None:
    """The start of a run: nothing has succeeded yet, and three over-long prompts failed on every shard."""
    over_long = diag(400, "maximum context length is 256 tokens, you requested 297", infra=False)
    evidence = Evidence()
    wave = zip([1, 1, 2, 2, 3, 3], (*SHARDS, "a", "b"), strict=True)
    first_wave = [fail(evidence, p, s, over_long, in_flight=29) for p, s in wave]
    assert Blame.MISCONFIGURED not in first_wave, "three poison prompts among 32 in flight"
    assert fail(evidence, 4, "a", over_long, in_flight=2) is Blame.MISCONFIGURED, "most attempts got it: the fleet"
    unauthorized = Evidence()
    verdicts = [fail(unauthorized, p, s, diag(401), in_flight=29) for p, s in enumerate(SHARDS)]
    assert verdicts[-1] is Blame.MISCONFIGURED, "a 401 is about the caller, not the prompt: no majority needed"


def test_the_signature_ignores_who_answered_and_the_numbers_in_the_message() -> None:
    one = signature(diag(500, "shard a (http://a:8000) answered HTTP 500: bad max_tokens -5"), "a", "http://a:8000")
    two = signature(diag(500, "shard b (http://b:8000) answered HTTP 500: bad max_tokens -7"), "b", "http://b:8000")
    three = signature(diag(500, "shard-12 answered HTTP 500: bad max_tokens -5"), "shard-12", "http://x:1")
    assert three is not None
    assert "bad max_tokens" in three[2]
    assert one == two
    assert one is not None
    assert one[1] == 500
    assert signature(diag(None), "a", "http://a:8000") is None, "no status: nothing to weigh"


def test_backpressure_is_its_own_verdict_and_leaves_no_evidence() -> None:
    evidence = Evidence()
    assert fail(evidence, 1, "a", diag(429)) is Blame.BACKPRESSURE
    assert fail(evidence, 2, "a", diag(503, retry_after=2.0)) is Blame.BACKPRESSURE
    assert evidence.streaks == {}
    assert evidence.fleet == {}
    assert fail(evidence, 3, "a", diag(503)) is Blame.FIRST_VERDICT, "503 without Retry-After is not backpressure"


def test_a_signature_on_every_shard_with_nothing_succeeding_is_a_misconfigured_fleet() -> None:
    evidence = Evidence()
    verdicts = [fail(evidence, prompt, shard, diag(401, "Unauthorized")) for prompt, shard in enumerate(SHARDS)]
    assert verdicts[:-1] == [Blame.FIRST_VERDICT] * 3
    assert verdicts[-1] is Blame.MISCONFIGURED, "all four shards showed it: within one attempt per shard"
    sig = signature(diag(401, "Unauthorized"), "a", "")
    assert sig is not None
    verdict = judge(evidence, prompt=9, shard="a", sig=sig, diagnosis=diag(401, "Unauthorized"), healthy=SHARDS)
    assert "every shard answers 401 Unauthorized: check the API key" in verdict.evidence


def test_a_success_anywhere_means_the_fleet_is_not_misconfigured() -> None:
    evidence = Evidence()
    fail(evidence, 0, "a", diag(401))
    evidence.succeeded("d", 7)
    assert [fail(evidence, p, s, diag(401)) for p, s in enumerate(SHARDS, start=1)][-1] is not Blame.MISCONFIGURED


def test_transient_statuses_never_make_a_fleet_misconfigured() -> None:
    evidence = Evidence()
    assert all(fail(evidence, p, s, diag(503)) is not Blame.MISCONFIGURED for p, s in enumerate(SHARDS * 3))


def test_one_prompt_on_every_shard_is_not_a_misconfiguration() -> None:
    evidence = Evidence()
    assert all(fail(evidence, 0, s, diag(401)) is not Blame.MISCONFIGURED for s in SHARDS)


def test_a_failure_that_follows_one_prompt_across_serving_shards_is_a_poison_prompt() -> None:
    evidence = Evidence()
    for shard in SHARDS:
        evidence.succeeded(shard, f"other-{shard}")
    assert fail(evidence, 5, "a", diag(500, "bad request")) is Blame.FIRST_VERDICT
    assert fail(evidence, 5, "b", diag(500, "bad request")) is Blame.POISON


def test_transient_statuses_on_serving_shards_never_make_a_prompt_poison() -> None:
    """Two shards overloaded at once (503 bursts) told one prompt "not now": that prompt is not bad; it is retried."""
    evidence = Evidence()
    for shard in SHARDS:
        evidence.succeeded(shard, f"other-{shard}")
    for status in (408, 425, 502, 503, 504):
        assert [fail(evidence, status, shard, diag(status)) for shard in SHARDS] == [Blame.FIRST_VERDICT] * 4


def test_shards_that_never_served_anything_do_not_convict_a_prompt() -> None:
    evidence = Evidence()
    fail(evidence, 5, "a", diag(500, "x"))
    assert fail(evidence, 5, "b", diag(500, "x")) is Blame.FIRST_VERDICT


def test_a_failure_that_follows_one_shard_while_others_serve_its_prompts_is_a_sick_shard() -> None:
    evidence = Evidence()
    assert fail(evidence, 1, "a", diag(422, "bad", infra=False)) is Blame.FIRST_VERDICT
    evidence.succeeded("b", 1)  # another shard served the prompt shard a failed
    assert fail(evidence, 2, "a", diag(422, "bad", infra=False)) is Blame.SICK_SHARD
    sig = signature(diag(422, "bad", infra=False), "a", "")
    assert sig is not None
    assert evidence.judged_sick("a", sig)


@pytest.mark.parametrize("status", [401, 403, 404, 407])
def test_an_answer_about_the_shard_or_the_fleet_from_one_shard_while_others_serve_is_a_sick_shard(status: int) -> None:
    """The first verdict is DATA; the evidence says whose it is, and the charges the shard made are refunded."""
    evidence = Evidence()
    assert fail(evidence, 1, "a", diag(status)) is Blame.FIRST_VERDICT
    evidence.succeeded("b", 1)
    assert fail(evidence, 2, "a", diag(status)) is Blame.SICK_SHARD
    sig = signature(diag(status), "a", "")
    assert sig is not None
    assert evidence.judged_sick("a", sig), "the data charges shard a made are not refunded"


@pytest.mark.parametrize("status", [401, 403, 404, 407])
def test_an_answer_about_the_shard_or_the_fleet_never_convicts_a_prompt(status: int) -> None:
    """Shards that served others give one prompt the same answer: a 400 makes it poison, a 401 never does; nor does
    its data budget or its infra budget running out on that answer (data verdicts are never confirmed)."""
    for answer, convicts in ((400, True), (status, False)):
        evidence = Evidence()
        for shard in SHARDS:
            evidence.succeeded(shard, f"other-{shard}")
        fail(evidence, 5, "a", diag(answer))
        assert (fail(evidence, 5, "b", diag(answer)) is Blame.POISON) is convicts
        sig = signature(diag(answer), "a", "")
        assert sig is not None
        assert evidence.confirmed(5, sig) is convicts
        assert evidence.followed(5, sig) is convicts
    nothing_served = Evidence()
    fail(nothing_served, 6, "a", diag(status))
    sig = signature(diag(status), "a", "")
    assert sig is not None
    assert not nothing_served.confirmed(6, sig), "nothing to compare with, and still not the prompt's"


@pytest.mark.parametrize("status", [401, 403, 404, 407])
def test_an_answer_about_the_fleet_stands_once_every_shard_gave_it_to_the_prompt(status: int) -> None:
    """Not the prompt's, but the fleet's: no shard would answer otherwise (a router relays it to its client as it
    came), while one shard that answered otherwise keeps it open."""
    evidence = Evidence()
    sig = signature(diag(status), "a", "")
    assert sig is not None
    for shard in SHARDS[:-1]:
        fail(evidence, 1, shard, diag(status))
        assert not evidence.confirmed(1, sig), f"only {shard} and those before it answered"
    fail(evidence, 1, SHARDS[-1], diag(status))
    assert evidence.confirmed(1, sig)


def test_two_poison_prompts_on_one_healthy_shard_do_not_make_it_sick() -> None:
    evidence = Evidence()
    fail(evidence, 1, "a", diag(400, "too long", infra=False))
    assert fail(evidence, 2, "a", diag(400, "too long", infra=False)) is Blame.FIRST_VERDICT


def test_a_success_on_the_shard_ends_its_streak() -> None:
    evidence = Evidence()
    fail(evidence, 1, "a", diag(401))
    evidence.succeeded("b", 1)
    evidence.succeeded("a", 3)
    assert fail(evidence, 2, "a", diag(401)) is Blame.FIRST_VERDICT


def test_a_single_shard_fleet_has_no_sick_shard_to_route_around() -> None:
    evidence = Evidence()
    fail(evidence, 1, "a", diag(422, infra=False), healthy=("a",))
    evidence.succeeded("a", 9)
    fail(evidence, 2, "a", diag(422, infra=False), healthy=("a",))
    assert fail(evidence, 3, "a", diag(422, infra=False), healthy=("a",)) is not Blame.SICK_SHARD


def test_a_data_verdict_is_confirmed_by_shards_that_serve_other_prompts() -> None:
    evidence = Evidence()
    for shard in ("a", "b"):
        evidence.succeeded(shard, f"other-{shard}")
    fail(evidence, 1, "a", diag(422, "x", infra=False))
    sig = signature(diag(422, "x", infra=False), "a", "")
    assert sig is not None
    assert evidence.confirmed(1, sig)


def test_an_answer_from_a_shard_that_serves_nothing_while_others_serve_is_not_confirmed() -> None:
    evidence = Evidence()
    evidence.succeeded("a", "other")
    fail(evidence, 1, "c", diag(413, "too large", infra=False))
    fail(evidence, 1, "d", diag(413, "too large", infra=False))
    sig = signature(diag(413, "too large", infra=False), "c", "")
    assert sig is not None
    assert not evidence.confirmed(1, sig), "two of four shards agreeing may be the shards' answer"


def test_before_anything_has_been_served_a_data_verdict_stands() -> None:
    evidence = Evidence()
    fail(evidence, 1, "c", diag(400, "context length", infra=False))
    sig = signature(diag(400, "context length", infra=False), "c", "")
    assert sig is not None
    assert evidence.confirmed(1, sig), "nothing to compare with: the seed's data budget decides"


@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from(SHARDS), st.sampled_from([401, 500, 422])), max_size=300))
def test_evidence_stays_bounded_and_forgets_finished_prompts(failures: list[tuple[int, str, int]]) -> None:
    evidence = Evidence()
    for prompt, shard, status in failures:
        fail(evidence, prompt, shard, diag(status, f"m{status}"))
    for prompt, _, _ in failures:
        evidence.forget(prompt)
    assert evidence.prompts == {}
    for streaks in evidence.streaks.values():
        assert all(len(prompts) <= 8 for prompts in streaks.values())
    sightings: dict[Signature, object] = dict(evidence.fleet)
    assert len(sightings) <= 256


def test_a_busy_shard_share_halves_to_a_floor_and_grows_back_with_successes() -> None:
    shares = Shares()
    assert shares.of("a") == 1.0
    assert shares.busy("a") == 0.5
    for _ in range(10):
        shares.busy("a")
    assert shares.of("a") == MIN_SHARE
    for _ in range(8):
        shares.served("a")
    assert shares.of("a") == 1.0
    assert shares.of("b") == 1.0, "other shards keep their full share"


def test_one_non_transient_answer_from_two_shards_is_the_prompts_by_elimination() -> None:
    evidence = Evidence()
    fail(evidence, 1, "a", diag(500, "1 validation error: max_tokens"))
    fail(evidence, 1, "b", diag(500, "1 validation error: max_tokens"))
    sig = signature(diag(500, "1 validation error: max_tokens"), "a", "")
    assert evidence.followed(1, sig)
    fail(evidence, 2, "a", diag(503, "busy"))
    fail(evidence, 2, "b", diag(503, "busy"))
    assert not evidence.followed(2, signature(diag(503, "busy"), "a", "")), "transient answers never convict"
    fail(evidence, 3, "a", diag(500, "x"))
    fail(evidence, 3, "b", diag(502, "y"))
    assert not evidence.followed(3, signature(diag(500, "x"), "a", "")), "different answers: not the prompt"


def test_one_healthy_shard_of_a_larger_fleet_is_not_the_fleet() -> None:
    """Three shards out of the healthy set (down) and the last one answering 404: one sick shard, not a misconfigured
    fleet; a fleet that only ever had one shard is judged on that one."""
    evidence = Evidence()
    for shard in SHARDS:
        evidence.succeeded(shard, f"other-{shard}")
    assert all(fail(evidence, p, "a", diag(404), healthy=("a",)) is not Blame.MISCONFIGURED for p in range(5))
    alone = Evidence()
    assert [fail(alone, p, "a", diag(401), healthy=("a",)) for p in range(2)][-1] is Blame.MISCONFIGURED


ENGINE_DEAD = "HTTP 500: EngineCore encountered an issue. See stack trace (above) for the root cause."
"""What vLLM 0.32 answers once its engine core died (EngineDeadError), measured in tests/vllm."""


def test_a_500_saying_the_engine_died_ejects_at_once_and_is_never_the_prompts_or_the_fleets() -> None:
    """A plain 500 may be a poison prompt's (llama.cpp answers a malformed request so on every shard), so it waits for
    evidence; vLLM's dead-engine 500 is the server saying it is broken: eject at once, never convict a prompt, never
    call the fleet misconfigured (two engines dying at once are two dead shards)."""
    dead = diag(500, ENGINE_DEAD)
    assert waits_for_evidence(signature(diag(500, "boom"), "a", "http://a:8000"))
    assert not waits_for_evidence(signature(dead, "a", "http://a:8000"))
    streamed = diag(200, "the stream carried an error: {'message': '" + ENGINE_DEAD + "', 'code': 500}", infra=True)
    assert not waits_for_evidence(signature(streamed, "a", "http://a:8000")), "the same error as a stream's event"
    evidence = Evidence()
    for shard in SHARDS:
        evidence.succeeded(shard, f"other-{shard}")
    assert [fail(evidence, 5, shard, dead) for shard in SHARDS] == [Blame.FIRST_VERDICT] * 4  # no poison prompt
    fresh = Evidence()
    assert all(fail(fresh, p, s, dead) is Blame.FIRST_VERDICT for p in range(3) for s in SHARDS)  # no misconfigured
    assert not evidence.followed(5, signature(dead, "a", "http://a:8000"))  # nor one by elimination
