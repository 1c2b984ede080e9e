"""The gray-failure detector (dispatch/quality.py): false quarantines on healthy fleets, and how many samples a faulty
shard serves before it is quarantined.

Pure and seeded: samples are what the sim shard answers (its model's answers to a mix of arithmetic, reverse and echo
prompts, its logprobs, its ``garble_rate`` garbage, all from ``rollout_runtime.sim``), fed straight to the detector
as the dispatcher feeds it, with a trainer's mismatch for every sample. No servers: the figures are the detector's,
not the network's, and the same seed gives the same figures on any machine.

- healthy: 8 shards, no fault; false quarantines over all checks, at the default rate (1e-6 per check) and at a
  loose 1e-2, where the measured rate per check shows that the stated bound holds (Bonferroni and overlapping
  windows make it conservative);
- garble 10% / 0.1%: one shard of 8 garbles that share of its samples (``SimFaults.garble_rate``);
- mismatch +1 sd / +0.3 sd: one shard's mismatch is shifted by that many peer standard deviations (a wrong
  checkpoint under the right version), its outputs otherwise like its peers'.

Detection delay is counted in the faulty shard's own samples, up to a cap (then: not detected).

    python bench/quality.py            # full run (about five minutes on one core)
    python bench/quality.py --smoke    # tiny sizes, used by the test suite so the script cannot rot
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from rollout_runtime.dispatch.quality import QualityDetector, QualitySettings, Sample
from rollout_runtime.sim.shard import expected_answer, garble
from rollout_runtime.sim.tokens import token_logprob

SHARDS = tuple(f"shard-{i}" for i in range(8))
MAX_TOKENS = 128
"""The requests' token limit: a garbled sample runs to it, as a broken engine runs to max_tokens."""
VERSION = 1
MISMATCH_MEAN = 0.02
"""A healthy sample's mean |trainer - rollout| logprob error, exponentially distributed (sd = mean): small and
skewed, as NeMo-RL's token_mult_prob_error is on matching weights."""


def prompt(rng: random.Random) -> str:
    """A prompt of the sim's three kinds: an arithmetic question, a reversal or an echo of 1-64 words."""
    kind = rng.randrange(3)
    if kind == 0:
        return f"What is {rng.randrange(1000)} {rng.choice('+-*')} {rng.randrange(1000)}?"
    words = " ".join(f"w{rng.randrange(5000)}" for _ in range(rng.randint(1, 64)))
    return f"reverse: {words}" if kind == 1 else words


def sample(rng: random.Random, garbled: bool) -> Sample:
    """What the sim shard's answer says to the detector: its length, finish and mean logprob."""
    text = garble(rng, MAX_TOKENS) if garbled else expected_answer(prompt(rng))
    words = text.split()[:MAX_TOKENS]
    finish = "length" if garbled or len(words) == MAX_TOKENS else "stop"
    logprob = sum(token_logprob(w) for w in words) / len(words) if words else None
    return Sample(empty=not words, odd_finish=finish not in ("stop", "length"), length=len(words), logprob=logprob)


@dataclass(frozen=True)
class Fault:
    name: str
    garble: float = 0.0
    mismatch_shift: float = 0.0
    """In peer standard deviations (= MISMATCH_MEAN for the exponential)."""


@dataclass
class Result:
    checks: int
    false: int
    delay: int | None
    """The faulty shard's samples before its quarantine; None: not within the cap."""


def run(fault: Fault | None, samples_per_shard: int, seed: int, rate: float) -> Result:
    """Feed every shard ``samples_per_shard`` samples round-robin (the faulty one is shard-3) and a mismatch for each;
    stop at the faulty shard's quarantine. A healthy shard's is counted false and the shard judged afresh."""
    rng = random.Random(seed)
    detector = QualityDetector(QualitySettings(false_positive_rate=rate))
    faulty = "shard-3" if fault is not None else None
    garble_rate = fault.garble if fault is not None else 0.0
    shift = fault.mismatch_shift if fault is not None else 0.0
    false = 0
    for n in range(1, samples_per_shard + 1):
        for shard in SHARDS:
            bad = shard == faulty
            garbled = bad and rng.random() < garble_rate
            mismatch = rng.expovariate(1 / MISMATCH_MEAN) + (shift * MISMATCH_MEAN if bad else 0.0)
            observed = detector.observe(shard, VERSION, sample(rng, garbled))
            for verdict in (observed, detector.report(shard, VERSION, mismatch)):
                if verdict is None:
                    continue
                if verdict.shard == faulty:
                    return Result(detector.checks, false, n)
                false += 1
                detector.forget(verdict.shard)
    return Result(detector.checks, false, None)


def healthy(samples_per_shard: int, seeds: range, rate: float) -> tuple[int, int, int]:
    """Checks, false quarantines and samples over healthy fleets at ``rate``."""
    results = [run(None, samples_per_shard, seed, rate) for seed in seeds]
    return sum(r.checks for r in results), sum(r.false for r in results), samples_per_shard * len(SHARDS) * len(seeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = parser.parse_args()
    healthy_samples, healthy_seeds = (300, range(1)) if args.smoke else (5_000, range(4))
    loose_samples, loose_seeds = (300, range(1)) if args.smoke else (2_000, range(4))
    cap, repeats = (400, range(2)) if args.smoke else (2_000, range(10))

    print(f"gray-failure detector, seeded, {len(SHARDS)} shards, window 256, a check every 25 signals of a shard")
    checks, false, samples = healthy(healthy_samples, healthy_seeds, 1e-6)
    print(f"healthy, rate 1e-6 : {false} false quarantines in {checks} checks over {samples} samples")
    checks, false, samples = healthy(loose_samples, loose_seeds, 1e-2)
    measured = false / checks if checks else 0.0
    print(
        f"healthy, rate 1e-2 : {false} false quarantines in {checks} checks over {samples} samples:"
        f" {measured:.2e} per check"
    )

    faults = (
        Fault("garble 10%", garble=0.10),
        Fault("garble 0.1%", garble=0.001),
        Fault("mismatch +1 sd", mismatch_shift=1.0),
        Fault("mismatch +0.3 sd", mismatch_shift=0.3),
    )

    def describe(delays: list[int]) -> str:
        return f"median {statistics.median(delays):.0f}, max {max(delays)} samples" if delays else "never"

    for fault in faults:
        results = [run(fault, cap, seed, 1e-6) for seed in repeats]
        delays = [r.delay for r in results if r.delay is not None]
        false = sum(r.false for r in results)
        print(
            f"{fault.name:<17}: caught {len(delays)}/{len(results)} within {cap} of its samples"
            f" ({describe(delays)}); {false} false quarantines of healthy shards"
        )


if __name__ == "__main__":
    main()
