"""Gray-failure evidence: a shard that answers 200 with wrong outputs, told apart from its peers, as pure state.

Probes and error statuses see nothing when a shard returns well-formed completions from broken state (a garbling
engine, a shard reloaded with the wrong checkpoint under the right version). Its samples still differ from those of
the shards serving the same weights version, and that is what this module tests, per (shard, version), over a
sliding window of each signal:

======================  ========================================================  =================================
signal                  what a sample contributes                                 tests against the peers
======================  ========================================================  =================================
``empty``               the completion is empty (1) or not (0)                    rate
``odd_finish``          finish reason other than stop/length (abort, error...)    rate
``length``              completion tokens (higher is worse: garbage runs on)      shift, tail
``logprob``             mean shard-reported logprob of the sampled tokens         shift, tail (lower is worse)
``mismatch``            the trainer's own signal (``report``): higher is worse    shift, tail
======================  ========================================================  =================================

The peers are the other shards of the same version, pooled: the comparison is with what this policy's outputs look
like on this fleet right now, so no absolute threshold has to be known. Three tests, each one-sided:

- *rate*: Fisher's exact test of the shard's rate against the peers' pooled rate. Not a binomial tail at the peers'
  rate, because that rate is itself an estimate: with no empty completion in the peers' window a binomial test
  flags a shard for its first one.
- *shift*: Mann-Whitney's U (normal approximation with tie and continuity corrections), for a shard whose every
  sample is off (wrong weights under the right version). It assumes no distribution of lengths or logprobs.
- *tail*: Fisher's exact test of the shard's share of the combined sample's worst :data:`TAIL_FRACTION`, for a
  shard whose *some* samples are garbage (a rank test barely moves when 10% of a window are outliers). Under the
  null every sample is exchangeable, so the count is exactly hypergeometric.

A broken peer inside the pool must not make a healthy shard look like the outlier, so a shard is flagged only when
it is also worse than most of its peers one by one (by the minimum effect), and only with at least
:data:`_MIN_PEERS` peers: with one, two shards disagree and nothing says which is wrong.

A check runs every :attr:`QualitySettings.check_every` observations of a (shard, version), on each signal with at least
``min_samples`` on both sides; it flags only a p-value below ``false_positive_rate`` divided by the tests it makes
(Bonferroni), so a check of a healthy shard flags with probability at most ``false_positive_rate``, and a run's
expected false quarantines are at most its checks times that rate. Windows overlap from one check to the next, which
makes the checks correlated and the bound conservative. A significant difference must also be large
(``min_rate_ratio``, ``min_effect``): with thousands of peer samples a trivial difference is significant, and a
quarantine costs the fleet a shard.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from rollout_runtime.results import Completion

__all__ = [
    "SIGNALS",
    "TAIL_FRACTION",
    "QualityDetector",
    "QualitySettings",
    "QualityVerdict",
    "Sample",
    "Signal",
    "fisher_upper",
    "mann_whitney",
    "normal_upper",
    "samples_of",
]

Signal = Literal["empty", "odd_finish", "length", "logprob", "mismatch"]
SIGNALS: Final[tuple[Signal, ...]] = ("empty", "odd_finish", "length", "logprob", "mismatch")
_RATES: Final[frozenset[Signal]] = frozenset({"empty", "odd_finish"})
Side = Literal["greater", "less", "two-sided"]
Test = Literal["rate", "shift", "tail"]
_SIDE: Final[Mapping[Signal, Side]] = {
    "empty": "greater",
    "odd_finish": "greater",
    "length": "greater",  # garbage runs on to the limit; one that stops at once is an empty completion
    "logprob": "less",  # broken weights make the sampled tokens unlikely under the shard's own distribution
    "mismatch": "greater",
}
_NORMAL_FINISH: Final[frozenset[str]] = frozenset({"stop", "length"})
TAIL_FRACTION: Final[float] = 0.01
"""The tail test's share of the combined sample: rare enough that a few garbled samples stand out against it (10%
garbled is ten times the tail's share), common enough that the peers' pooled window holds some of it (about 18 of 7
peers x 256 samples), so their rate is measured rather than zero."""
_MIN_PEERS: Final[int] = 2


# -- the statistics: pure functions of counts and values, tested against published values ----------------------


def normal_upper(z: float) -> float:
    """P(Z >= z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_upper(k: int, n: int, peer_k: int, peer_n: int) -> float:
    """One-sided Fisher's exact p-value that a rate of ``k``/``n`` is higher than the peers' ``peer_k``/``peer_n``.

    P(X >= k) for X hypergeometric: ``n`` draws from ``n + peer_n`` samples of which ``k + peer_k`` are positive.
    """
    if not (0 <= k <= n and 0 <= peer_k <= peer_n):
        raise ValueError(f"need 0 <= k <= n and 0 <= peer_k <= peer_n, got {k}/{n} and {peer_k}/{peer_n}")
    total, positive = n + peer_n, k + peer_k
    top = min(n, positive)
    if k > top or k == 0:
        return 1.0 if k == 0 else 0.0
    denominator = _log_comb(total, n)
    terms = [_log_comb(positive, x) + _log_comb(total - positive, n - x) - denominator for x in range(k, top + 1)]
    peak = max(terms)
    return min(1.0, math.exp(peak) * sum(math.exp(t - peak) for t in terms))


def _ranks(values: Sequence[float]) -> tuple[list[float], float]:
    """Average ranks (1-based) of ``values`` and the tie term sum(t^3 - t) over groups of ties."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties = 0.0
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        rank = (start + end) / 2 + 1
        for i in range(start, end + 1):
            ranks[order[i]] = rank
        size = end - start + 1
        ties += size**3 - size
        start = end + 1
    return ranks, ties


def mann_whitney(x: Sequence[float], y: Sequence[float], side: Side) -> tuple[float, float]:
    """Mann-Whitney U of ``x`` against ``y`` and its p-value (normal approximation with tie and continuity
    corrections, as scipy's ``method="asymptotic"``). ``side="greater"``: ``x`` tends to be larger than ``y``."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples must be non-empty")
    ranks, ties = _ranks([*x, *y])
    u = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    n = n1 + n2
    mean = n1 * n2 / 2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:  # every value tied: no evidence either way
        return u, 1.0
    sd = math.sqrt(variance)
    upper = normal_upper((u - mean - 0.5) / sd)
    lower = normal_upper((mean - u - 0.5) / sd)
    if side == "greater":
        return u, upper
    if side == "less":
        return u, lower
    return u, min(1.0, 2 * min(upper, lower))


# -- samples -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """What one generated sample says about its shard's state, read from the shard's own answer."""

    empty: bool
    odd_finish: bool
    length: float
    logprob: float | None = None
    """Mean logprob of the sampled tokens, when the shard reported them."""


def samples_of(result: object) -> tuple[Sample, ...]:
    """One :class:`Sample` per choice of a :class:`Completion` (or of a result's ``completion`` attribute, as an
    environment's result may carry); none for anything else, whose quality only the trainer's hook can report."""
    completion = result if isinstance(result, Completion) else getattr(result, "completion", None)
    if not isinstance(completion, Completion):
        return ()
    out = []
    for choice in completion.choices:
        known = [v for v in choice.logprobs or () if v is not None and math.isfinite(v)]
        length = len(choice.token_ids) if choice.token_ids is not None else len(choice.text.split())
        out.append(
            Sample(
                empty=not choice.text.strip() and not choice.token_ids,
                odd_finish=choice.finish_reason is not None and choice.finish_reason not in _NORMAL_FINISH,
                length=float(length),
                logprob=sum(known) / len(known) if known else None,
            )
        )
    return tuple(out)


# -- the detector -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QualitySettings:
    """How much evidence a quarantine needs. Each default is argued where it is declared."""

    false_positive_rate: float = 1e-6
    """Probability that one check of a healthy shard flags it (Bonferroni over the tests it makes): 10 million samples,
    each with a reported mismatch, are 800,000 checks at one per 25 observations, so at most 0.8 false quarantines
    are expected; the bound is conservative (measured 17x under it at 1e-2), and a shard shifted by a whole standard
    deviation is still found at its first check (see docs/benchmarks.md)."""
    window: int = 256
    """Recent samples per (shard, version) and signal: long enough that a 10% fault shows tens of bad samples,
    short enough that evidence from before a fault or a reload is gone after one window."""
    min_samples: int = 32
    """Fewest samples on each side before a signal is tested: below it the normal approximation of U is poor and a
    rate test has no power."""
    check_every: int = 25
    """Observations of a (shard, version) between checks, each sample and each mismatch the trainer reports for one
    counting once: the detection delay grows by at most this, and the number of checks (hence false quarantines,
    at a fixed rate per check) falls with it."""
    min_rate_ratio: float = 2.0
    """A rate signal flags only at least this many times the peers' rate: a significant 10% excess over thousands
    of samples is not a broken shard."""
    min_effect: float = 0.3
    """A continuous signal flags only when the shard's mean is this many peer standard deviations off (Glass's
    delta): a smaller shift sits within the fleet's own spread, and taking a shard out for it costs more than it
    saves."""

    def __post_init__(self) -> None:
        if not 0 < self.false_positive_rate < 1:
            raise ValueError(f"false_positive_rate must be in (0, 1), got {self.false_positive_rate}")
        if self.min_samples < 2 or self.window < self.min_samples or self.check_every < 1:
            raise ValueError("need 2 <= min_samples <= window and check_every >= 1")


@dataclass(frozen=True, slots=True)
class QualityVerdict:
    """A shard whose ``signal`` differs from its peers' on ``version``: the test, and the evidence it rests on."""

    shard: str
    version: int | None
    signal: Signal
    test: Test
    statistic: float
    """U (shift) or the shard's count (rate, tail)."""
    p_value: float
    threshold: float
    """The p-value it had to beat: the false-positive rate over the tests made in this check."""
    effect: float
    """Glass's delta in the bad direction (shift) or the ratio of the shard's rate to the peers' (rate, tail)."""
    evidence: Mapping[str, float]
    """Counts and means on each side: ``samples``/``peer_samples``, then ``count``/``rate`` (and the tail's ``cut``)
    or ``mean``/``peer_sd``."""
    peers: tuple[str, ...]


@dataclass(slots=True)
class _Window:
    values: dict[Signal, deque[float]] = field(default_factory=dict)
    since_check: int = 0


class QualityDetector:
    """Per-shard, per-version windows of sample signals, checked against the pooled peers of the same version."""

    def __init__(self, settings: QualitySettings | None = None) -> None:
        self.settings = settings or QualitySettings()
        self._windows: dict[str, tuple[int | None, _Window]] = {}
        self.checks = 0
        """Checks made (each one a chance of a false positive at the stated rate)."""

    def observe(self, shard: str, version: int | None, sample: Sample) -> QualityVerdict | None:
        """A sample ``shard`` produced at ``version``; a verdict when this completes a check that flags it."""
        window = self._window(shard, version)
        self._add(window, "empty", float(sample.empty))
        self._add(window, "odd_finish", float(sample.odd_finish))
        self._add(window, "length", sample.length)
        if sample.logprob is not None and math.isfinite(sample.logprob):
            self._add(window, "logprob", sample.logprob)
        return self._counted(shard, version, window)

    def report(self, shard: str, version: int | None, mismatch: float) -> QualityVerdict | None:
        """The trainer's signal for a sample ``shard`` produced at ``version`` (higher is worse)."""
        if not math.isfinite(mismatch):
            raise ValueError(f"mismatch must be finite, got {mismatch}")
        window = self._window(shard, version)
        self._add(window, "mismatch", mismatch)
        return self._counted(shard, version, window)

    def forget(self, shard: str) -> None:
        """Drop ``shard``'s windows: it was quarantined (its samples are no baseline for its peers, and after its
        return it is judged on new samples only) or it left the fleet."""
        self._windows.pop(shard, None)

    def check(self, shard: str) -> QualityVerdict | None:
        """Test ``shard`` now (the check :meth:`observe` runs every ``check_every`` samples)."""
        held = self._windows.get(shard)
        if held is None:
            return None
        version, window = held
        settings = self.settings
        peers = sorted(name for name, (v, _) in self._windows.items() if name != shard and v == version)
        tests: list[tuple[Signal, Test, list[float], list[list[float]]]] = []
        for signal in SIGNALS:
            mine = window.values.get(signal)
            if mine is None or len(mine) < settings.min_samples:
                continue
            theirs = [
                list(values)
                for peer in peers
                if len(values := self._windows[peer][1].values.get(signal, ())) >= settings.min_samples
            ]
            if len(theirs) < _MIN_PEERS:
                continue
            kinds: tuple[Test, ...] = ("rate",) if signal in _RATES else ("shift", "tail")
            tests.extend((signal, kind, list(mine), theirs) for kind in kinds)
        if not tests:
            return None
        self.checks += 1
        threshold = settings.false_positive_rate / len(tests)
        flagged = [
            verdict
            for signal, kind, x, ys in tests
            if (verdict := self._test(shard, version, signal, kind, x, ys, threshold, peers)) is not None
        ]
        return min(flagged, key=lambda v: v.p_value) if flagged else None

    def _test(
        self,
        shard: str,
        version: int | None,
        signal: Signal,
        kind: Test,
        x: list[float],
        ys: list[list[float]],
        threshold: float,
        peers: Sequence[str],
    ) -> QualityVerdict | None:
        """One test of ``x`` against the pooled ``ys``; a verdict only when it is significant, large, and the shard
        is worse than most of its peers one by one (a broken peer in the pool must not make a healthy shard look
        like an outlier)."""
        settings = self.settings
        y = [v for values in ys for v in values]
        if kind == "shift":
            side = _SIDE[signal]
            mean, peer_mean = _mean(x), _mean(y)
            peer_sd = _sd(y, peer_mean)
            sign = 1.0 if side == "greater" else -1.0
            effect = _ratio(sign * (mean - peer_mean), peer_sd)
            if effect < settings.min_effect:  # cheap first: most checks of a healthy shard end here, before U
                return None
            each = [_ratio(sign * (mean - _mean(values)), peer_sd) >= settings.min_effect for values in ys]
            if not _most(each):
                return None
            u, p = mann_whitney(x, y, side)
            if p >= threshold:
                return None
            evidence = {"samples": len(x), "mean": mean, "peer_samples": len(y), "peer_mean": peer_mean}
            evidence["peer_sd"] = peer_sd
            return QualityVerdict(shard, version, signal, kind, u, p, threshold, effect, evidence, tuple(peers))
        if kind == "tail":  # the shard's share of the combined sample's worst TAIL_FRACTION: contamination
            cut = _cut([*x, *y], _SIDE[signal])
            worse = (lambda v: v >= cut) if _SIDE[signal] == "greater" else (lambda v: v <= cut)
            k, counts = sum(map(worse, x)), [sum(map(worse, values)) for values in ys]
        else:
            k, counts = round(sum(x)), [round(sum(values)) for values in ys]
        peer_k = sum(counts)
        p = fisher_upper(k, len(x), peer_k, len(y))
        if p >= threshold:
            return None
        rate, peer_rate = k / len(x), peer_k / len(y)
        ratio = settings.min_rate_ratio
        effect = _ratio(rate, peer_rate)
        each = [rate > 0 and _ratio(rate, c / len(values)) >= ratio for c, values in zip(counts, ys, strict=True)]
        if effect < ratio or not _most(each):
            return None
        evidence = {"samples": len(x), "count": k, "rate": rate}
        evidence |= {"peer_samples": len(y), "peer_count": peer_k, "peer_rate": peer_rate}
        if kind == "tail":
            evidence["cut"] = cut
        return QualityVerdict(shard, version, signal, kind, float(k), p, threshold, effect, evidence, tuple(peers))

    def _window(self, shard: str, version: int | None) -> _Window:
        held = self._windows.get(shard)
        if held is None or held[0] != version:  # a shard serves one version: a reload starts its evidence afresh
            held = (version, _Window())
            self._windows[shard] = held
        return held[1]

    def _add(self, window: _Window, signal: Signal, value: float) -> None:
        values = window.values.get(signal)
        if values is None:
            values = window.values[signal] = deque(maxlen=self.settings.window)
        values.append(value)

    def _counted(self, shard: str, version: int | None, window: _Window) -> QualityVerdict | None:
        window.since_check += 1
        if window.since_check < self.settings.check_every:
            return None
        window.since_check = 0
        return self.check(shard)


def _ratio(value: float, scale: float) -> float:
    """``value / scale``, infinite for a positive value over a zero scale (peers that never vary or never fail)."""
    if scale > 0:
        return value / scale
    return math.inf if value > 0 else 0.0


def _most(votes: Sequence[bool]) -> bool:
    """More than half."""
    return sum(votes) * 2 > len(votes)


def _cut(values: Sequence[float], side: Side) -> float:
    """The value beyond which the worst :data:`TAIL_FRACTION` of ``values`` lie (at least one value)."""
    count = max(1, math.ceil(len(values) * TAIL_FRACTION))
    worst = heapq.nlargest(count, values) if side == "greater" else heapq.nsmallest(count, values)
    return worst[-1]


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items)


def _sd(values: Sequence[float], mean: float) -> float:
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
