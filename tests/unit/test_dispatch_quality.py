"""Gray-failure evidence (dispatch/quality.py): the statistics against published values, then the detector's
behaviour on seeded healthy and faulty fleets, values in and a verdict out."""

from __future__ import annotations

import random

import pytest

from rollout_runtime.dispatch.quality import (
    QualityDetector,
    QualitySettings,
    QualityVerdict,
    Sample,
    fisher_upper,
    mann_whitney,
    normal_upper,
    samples_of,
)
from rollout_runtime.results import Choice, Completion

SHARDS = tuple(f"s{i}" for i in range(8))


def test_normal_tail_matches_the_table() -> None:
    assert normal_upper(0.0) == pytest.approx(0.5)
    assert normal_upper(1.959963984540054) == pytest.approx(0.025, rel=1e-9)
    assert normal_upper(-1.6448536269514722) == pytest.approx(0.95, rel=1e-9)


def test_fisher_matches_published_values() -> None:
    """Fisher's tea-tasting table [[3, 1], [1, 3]]: one-sided p = 17/70; Wikipedia's dieting table (9 of 12 women,
    1 of 12 men): one-sided p = 0.0013797, half its two-sided 0.002759 (the table itself has p = 0.001346)."""
    assert fisher_upper(3, 4, 1, 4) == pytest.approx(17 / 70, rel=1e-9)
    assert fisher_upper(9, 12, 1, 12) == pytest.approx(0.002759 / 2, rel=1e-3)
    assert fisher_upper(9, 12, 1, 12) > 0.001346076
    assert fisher_upper(0, 10, 5, 10) == 1.0


def test_fisher_does_not_flag_a_first_event_when_peers_have_none() -> None:
    """The reason for Fisher over a binomial at the peers' rate: the peers' zero is an estimate, not a fact."""
    assert fisher_upper(1, 256, 0, 1792) == pytest.approx(256 / 2048, rel=1e-9)


def test_mann_whitney_matches_scipy_asymptotic() -> None:
    """scipy's documented example: males [19, 22, 16, 29, 24] vs females [20, 11, 17, 12], U = 17,
    ``method="asymptotic"`` two-sided p = 0.11134688653314041."""
    u, p = mann_whitney([19, 22, 16, 29, 24], [20, 11, 17, 12], "two-sided")
    assert u == 17
    assert p == pytest.approx(0.11134688653314041, rel=1e-9)
    assert mann_whitney([19, 22, 16, 29, 24], [20, 11, 17, 12], "greater")[1] == pytest.approx(p / 2, rel=1e-9)
    assert mann_whitney([19, 22, 16, 29, 24], [20, 11, 17, 12], "less")[1] > 0.9


def test_mann_whitney_ties_and_all_tied() -> None:
    """Tie correction shrinks the variance (a smaller p than without it); all values tied is no evidence."""
    _, p = mann_whitney([1, 1, 2, 2, 3], [0, 0, 1, 1, 1], "greater")
    assert 0 < p < 0.05
    assert mann_whitney([5, 5, 5], [5, 5], "two-sided") == (3.0, 1.0)


def healthy(rng: random.Random) -> Sample:
    """A healthy shard's sample: finish reasons and lengths of a real policy, a rare empty completion."""
    empty = rng.random() < 0.01
    odd = rng.random() < 0.005
    return Sample(empty, odd, 0.0 if empty else float(rng.randint(5, 200)), rng.gauss(-1.0, 0.3))


def feed(
    detector: QualityDetector, rng: random.Random, rounds: int, sick: str | None = None, garble: float = 0.0
) -> list[tuple[int, QualityVerdict]]:
    """``rounds`` samples per shard, round-robin; ``sick`` garbles a ``garble`` fraction (long, unlikely tokens)."""
    verdicts = []
    for n in range(rounds):
        for shard in SHARDS:
            sample = healthy(rng)
            if shard == sick and rng.random() < garble:
                sample = Sample(False, False, 512.0, -9.0)
            if (verdict := detector.observe(shard, 3, sample)) is not None:
                verdicts.append((n, verdict))
    return verdicts


def test_a_healthy_fleet_is_never_flagged() -> None:
    """8 shards x 5,000 samples (1,600 checks): no verdict at the default rate (1e-6 per check)."""
    detector = QualityDetector()
    assert feed(detector, random.Random(1), 5_000) == []
    assert detector.checks >= 1_500


def test_a_shard_garbling_ten_percent_is_caught_within_a_window() -> None:
    detector = QualityDetector()
    verdicts = feed(detector, random.Random(2), 600, sick="s3", garble=0.10)
    assert verdicts, "a shard garbling 10% of its outputs was never flagged"
    first, verdict = verdicts[0]
    assert verdict.test == "tail", "the rank test is nearly blind to a 10% contamination; the tail test is not"
    assert verdict.shard == "s3"
    assert {v.shard for _, v in verdicts} == {"s3"}
    assert first < 256, f"caught after {first} samples, more than a window"
    assert verdict.signal in ("length", "logprob")
    assert verdict.p_value < verdict.threshold <= 1e-6
    assert verdict.effect >= 0.3
    assert verdict.peers == tuple(s for s in SHARDS if s != "s3")
    assert verdict.evidence["samples"] <= 256
    assert verdict.evidence["peer_samples"] >= 32 * 7


def test_a_rare_garble_is_below_the_minimum_effect() -> None:
    """0.1% garbled is 0.26 bad samples per window: indistinguishable from the fleet's spread, never flagged."""
    detector = QualityDetector()
    assert feed(detector, random.Random(3), 3_000, sick="s3", garble=0.001) == []


def test_a_shifted_mismatch_is_caught_and_the_evidence_says_how() -> None:
    detector = QualityDetector()
    rng = random.Random(4)
    verdict, rounds = None, 0
    while verdict is None and rounds < 400:
        rounds += 1
        for shard in SHARDS:
            shift = 1.0 if shard == "s5" else 0.0  # one peer standard deviation: a wrong checkpoint's scale
            verdict = verdict or detector.report(shard, 7, rng.gauss(shift, 1.0))
    assert verdict is not None
    assert verdict.shard == "s5"
    assert verdict.signal == "mismatch"
    assert verdict.version == 7
    assert rounds < 100, f"caught after {rounds} samples per shard"
    assert verdict.evidence["mean"] > verdict.evidence["peer_mean"] + 0.3 * verdict.evidence["peer_sd"]


def test_empty_rate_uses_fisher_and_the_ratio() -> None:
    """A shard answering empty is flagged on the rate; its peers, whose lengths exceed its zeros, are not: each is
    no worse than most of its peers one by one."""
    detector = QualityDetector(QualitySettings(check_every=1))
    verdicts = []
    for _ in range(64):
        for shard in SHARDS:
            sample = Sample(True, False, 0.0) if shard == "s0" else Sample(False, False, 9.0)
            if (verdict := detector.observe(shard, 1, sample)) is not None:
                verdicts.append(verdict)
    assert verdicts
    assert {v.shard for v in verdicts} == {"s0"}
    assert verdicts[0].signal == "empty"
    assert verdicts[0].test == "rate"
    assert verdicts[0].evidence["count"] == verdicts[0].evidence["samples"] >= 32
    assert verdicts[0].evidence["peer_count"] == 0


def test_peers_are_the_same_version_only() -> None:
    """A shard on another version is compared with nobody: its outputs are another policy's, not wrong."""
    detector = QualityDetector(QualitySettings(check_every=1))
    for shard in SHARDS[:4]:
        for _ in range(64):
            assert detector.observe(shard, 1, Sample(False, False, 10.0, -1.0)) is None
    for _ in range(64):
        assert detector.observe("s7", 2, Sample(True, True, 0.0, -9.0)) is None


def test_forget_and_reload_start_the_evidence_afresh() -> None:
    detector = QualityDetector(QualitySettings(check_every=1))
    for shard in SHARDS:
        for _ in range(40):
            detector.observe(shard, 1, Sample(False, False, 10.0))
    detector.forget("s0")
    assert detector.check("s0") is None
    for _ in range(31):
        assert detector.observe("s0", 1, Sample(False, False, 500.0)) is None  # not yet min_samples
    assert detector.observe("s0", 2, Sample(False, False, 500.0)) is None  # a reload drops the old window


def test_samples_of_reads_every_choice() -> None:
    completion = Completion(
        text="a b",
        finish_reason="stop",
        prompt_tokens=1,
        completion_tokens=2,
        model="m",
        shard="s",
        choices=(
            Choice(0, "a b", "stop", token_ids=(1, 2), logprobs=(-1.0, -3.0)),
            Choice(1, "", "abort"),
        ),
    )
    first, second = samples_of(completion)
    assert first == Sample(False, False, 2.0, -2.0)
    assert second == Sample(True, True, 0.0, None)
    assert samples_of("not a completion") == ()
    assert samples_of(object()) == ()
