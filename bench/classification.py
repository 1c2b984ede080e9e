"""How much does classify_rollout_failure cost? (issue: "so users know it is free")

Prints ns per call for typical and deep exception chains, each beside two baselines measured in the same run:
a bare function call and ``isinstance`` against a tuple (the least any classifier must do). Ratios, not absolute
numbers, are what to compare across machines.

    python bench/classification.py            # full run
    python bench/classification.py --smoke    # tiny sizes, used by the test suite so the script cannot rot
"""

from __future__ import annotations

import argparse
import itertools
import timeit
from collections.abc import Callable

import aiohttp

from rollout_runtime.failures import RolloutDataFailure, classify_rollout_failure, to_picklable_failure


def _chain(*excs: BaseException) -> BaseException:
    for outer, inner in itertools.pairwise(excs):
        outer.__cause__ = inner
    return excs[0]


def cases() -> dict[str, BaseException]:
    response = aiohttp.ClientResponseError(None, (), status=503)  # type: ignore[arg-type]
    return {
        "ConnectionResetError": ConnectionResetError(),
        "ClientResponseError 503": response,
        "ValueError (unknown -> data)": ValueError("bug"),
        "wrapper -> ConnectionResetError": _chain(RuntimeError("x"), ConnectionResetError()),
        "8-deep chain -> TimeoutError": _chain(*[RuntimeError(str(i)) for i in range(8)], TimeoutError()),
        "12-deep chain, nothing infra": _chain(*[RuntimeError(str(i)) for i in range(12)]),
        "data failure over infra cause": _chain(RolloutDataFailure("bad"), TimeoutError()),
        "group of 4 infra": ExceptionGroup("g", [TimeoutError(), ConnectionResetError()] * 2),
    }


def ns_per_call(func: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(func, number=number, repeat=repeat)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = parser.parse_args()
    number, repeat = (200, 2) if args.smoke else (200_000, 5)

    probe = ConnectionResetError()
    infra = (TimeoutError, ConnectionError)

    def noop(exc: BaseException) -> None:
        return None

    call_ns = ns_per_call(lambda: noop(probe), number, repeat)
    isinstance_ns = ns_per_call(lambda: isinstance(probe, infra), number, repeat)
    print(f"baseline: function call {call_ns:8.0f} ns, isinstance(tuple) {isinstance_ns:8.0f} ns")
    print(f"{'case':36} {'ns/call':>9} {'x call':>8}   {'convert ns':>10}")
    for name, exc in cases().items():
        classify = ns_per_call(lambda exc=exc: classify_rollout_failure(exc), number, repeat)
        convert = ns_per_call(lambda exc=exc: to_picklable_failure(exc), max(number // 10, 1), repeat)
        print(f"{name:36} {classify:9.0f} {classify / call_ns:8.1f}x   {convert:10.0f}")


if __name__ == "__main__":
    main()
