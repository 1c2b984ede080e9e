"""Fuzz the failure classification with arbitrary exceptions, cause chains, groups and hostile objects.

The generator builds a *spec* (what each link of a chain is: infrastructure, an explicit data failure, an HTTP
response error with a status, or something unknown) and then a real exception graph from it, choosing concrete
classes at random (built-ins, aiohttp's errors, the taxonomy, foreign look-alikes matched by name, Ray names inside
and outside the ``ray`` package). The spec's verdict is computed independently from the rules in the
``classify_rollout_failure`` docstring, so the properties compare the classifier with its specification, not with
itself.
"""

from __future__ import annotations

import itertools
import pickle
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rollout_runtime.failures import (
    MAX_MESSAGE_CHARS,
    FailureClass,
    GenerationUnavailable,
    GymTransportError,
    NoHealthyShards,
    RolloutDataFailure,
    RolloutFailure,
    RolloutRedispatchExhausted,
    RolloutStall,
    RolloutTerminalDataFailure,
    RolloutTimeout,
    classify_rollout_failure,
    failure_type,
    http_status_is_infra,
    to_picklable_failure,
)
from support.chaos import write_tally

TALLY: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def fuzz_report() -> Iterator[None]:
    yield
    write_tally("fuzz-failures", TALLY)


FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_LINKS = 9  # the exception itself plus 8 causes: the documented depth bound


def _foreign(name: str, module: str, base: type[Exception] = Exception) -> type[Exception]:
    """A class that only looks like another library's (same name, other identity), as after pickling."""
    return type(name, (base,), {"__module__": module})


def _response_error(status: int) -> Exception:
    return aiohttp.ClientResponseError(None, (), status=status, message="fuzzed")  # type: ignore[arg-type]


def _openai_status_error(status: int) -> Exception:
    exc = _foreign("APIStatusError", "openai")("fuzzed")
    exc.status_code = status  # type: ignore[attr-defined]
    return exc


INFRA_MAKERS = [
    lambda: TimeoutError("deadline"),
    lambda: ConnectionResetError("reset by peer"),
    lambda: ConnectionRefusedError("refused"),
    lambda: aiohttp.ServerDisconnectedError(),
    lambda: aiohttp.ClientPayloadError("cut off"),
    lambda: aiohttp.ClientOSError(104, "reset"),
    lambda: GenerationUnavailable("shard down", status=503),
    lambda: RolloutTimeout("slow"),
    lambda: NoHealthyShards("none"),
    lambda: GymTransportError("env gone"),
    lambda: _foreign("ReadTimeout", "httpx")("read timeout"),
    lambda: _foreign("APIConnectionError", "openai")("connection"),
    lambda: _foreign("RayActorError", "ray.exceptions")("actor died"),
    lambda: _foreign("GenerationUnavailable", "somewhere.pickled")("copy"),
]
DATA_MAKERS = [
    lambda: RolloutDataFailure("too long", status=400),
    lambda: RolloutTerminalDataFailure("never retry"),
    lambda: _foreign("RolloutDataFailure", "elsewhere")("copy of a data failure"),
]
UNKNOWN_MAKERS = [
    lambda: ValueError("bad value"),
    lambda: KeyError("reward"),
    lambda: RuntimeError("bug"),
    lambda: ZeroDivisionError("division"),
    lambda: _foreign("RayActorError", "not_ray.exceptions")("a look-alike outside ray"),
    lambda: _foreign("Mystery", "plugins.x")("unknown"),
    lambda: RolloutFailure("a bare base-class failure"),
]


@dataclass(frozen=True)
class Link:
    """One link of a chain: a single exception, or a group whose members are chains."""

    kind: str  # "infra" | "data" | "unknown" | "response" | "group"
    status: int = 0
    maker: int = 0
    members: tuple[tuple[Link, ...], ...] = ()


def links(depth: int) -> st.SearchStrategy[Link]:
    single = st.one_of(
        st.builds(Link, st.just("infra"), maker=st.integers(0, len(INFRA_MAKERS) - 1)),
        st.builds(Link, st.just("data"), maker=st.integers(0, len(DATA_MAKERS) - 1)),
        st.builds(Link, st.just("unknown"), maker=st.integers(0, len(UNKNOWN_MAKERS) - 1)),
        st.builds(Link, st.just("response"), status=st.integers(100, 599), maker=st.integers(0, 1)),
    )
    if depth <= 0:
        return single
    group = st.builds(
        Link, st.just("group"), members=st.lists(chains(depth - 1, max_links=3), min_size=1, max_size=3).map(tuple)
    )
    return st.one_of(single, single, group)


def chains(depth: int = 2, max_links: int = MAX_LINKS) -> st.SearchStrategy[tuple[Link, ...]]:
    return st.lists(links(depth), min_size=1, max_size=max_links).map(tuple)


def build(chain: tuple[Link, ...], noise: st.DataObject | None = None) -> BaseException:
    """The real exception graph for a chain: link i's ``__cause__`` is link i+1; optional ``__context__`` noise."""
    built = [_build_link(link, noise) for link in chain]
    for exc, cause in itertools.pairwise(built):
        exc.__cause__ = cause
    if noise is not None:
        for exc in built:
            if noise.draw(st.booleans(), label="context noise"):
                # "another error while handling this one" is not a cause and must never change the verdict
                exc.__context__ = RolloutDataFailure("implicit context, not a cause")
    return built[0]


def _build_link(link: Link, noise: st.DataObject | None) -> BaseException:
    if link.kind == "infra":
        return INFRA_MAKERS[link.maker]()
    if link.kind == "data":
        return DATA_MAKERS[link.maker]()
    if link.kind == "unknown":
        return UNKNOWN_MAKERS[link.maker]()
    if link.kind == "response":
        return _response_error(link.status) if link.maker == 0 else _openai_status_error(link.status)
    members = [build(member, noise) for member in link.members]
    return ExceptionGroup("fuzzed group", members)  # type: ignore[type-var]


def expected(chain: tuple[Link, ...]) -> tuple[bool, bool]:
    """(an explicit data failure decides it, some link is infra) — the docstring's rules, written out again."""
    infra = False
    for link in chain[:MAX_LINKS]:
        if link.kind == "data":
            return True, infra
        if link.kind == "group":
            verdicts = [expected(member) for member in link.members]
            if any(data for data, _ in verdicts):
                return True, infra
            infra = infra or all(member_infra for _, member_infra in verdicts)
        elif link.kind == "infra":
            infra = True
        elif link.kind == "response":
            infra = infra or http_status_is_infra(link.status)
    return False, infra


def verdict(chain: tuple[Link, ...]) -> FailureClass:
    data, infra = expected(chain)
    return FailureClass.INFRA if infra and not data else FailureClass.DATA


def _nodes(chain: tuple[Link, ...]) -> int:
    return sum(1 + sum(_nodes(m) for m in link.members) for link in chain)


@FUZZ
@given(chain=chains(), data=st.data())
def test_classification_matches_the_documented_rules_for_any_chain(chain: tuple[Link, ...], data: Any) -> None:
    """For every chain within the documented bounds (9 links, 64 exceptions), the verdict is the specification's:
    explicit data anywhere wins, else any infra link (a group: all members) makes it INFRA, else DATA; implicit
    ``__context__`` never matters; the same exception always gets the same verdict."""
    assume(_nodes(chain) <= 60)  # within the documented 64-exception bound; counted below only if kept
    TALLY["test_classification_matches_the_documented_rules_for_any_chain"] += 1
    exc = build(chain, data)
    assert classify_rollout_failure(exc) is verdict(chain)
    assert classify_rollout_failure(exc) is classify_rollout_failure(exc)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain=chains(depth=1, max_links=20), cycle_to=st.integers(0, 19))
def test_long_and_cyclic_chains_terminate_with_a_verdict(chain: tuple[Link, ...], cycle_to: int) -> None:
    """Chains longer than the bound and chains whose last cause points back into the chain terminate, and the
    verdict only depends on the first 9 links."""
    TALLY["test_long_and_cyclic_chains_terminate_with_a_verdict"] += 1
    exc = build(chain)
    tail = exc
    while tail.__cause__ is not None:
        tail = tail.__cause__
    nodes = [exc]
    while nodes[-1].__cause__ is not None:
        nodes.append(nodes[-1].__cause__)
    tail.__cause__ = nodes[min(cycle_to, len(nodes) - 1)]
    result = classify_rollout_failure(exc)
    assert isinstance(result, FailureClass)
    if len(chain) >= MAX_LINKS and _nodes(chain[:MAX_LINKS]) <= 60:
        assert result is verdict(chain[:MAX_LINKS])


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain=chains(depth=1, max_links=6))
def test_conversion_pickles_and_keeps_the_verdict_status_and_bound(chain: tuple[Link, ...]) -> None:
    """Converted failures pickle, classify exactly as the original, keep the first HTTP status of the chain, and
    carry a message of at most MAX_MESSAGE_CHARS."""
    TALLY["test_conversion_pickles_and_keeps_the_verdict_status_and_bound"] += 1
    exc = build(chain)
    converted = to_picklable_failure(exc)
    copy = pickle.loads(pickle.dumps(converted))
    assert isinstance(copy, RolloutFailure)
    assert classify_rollout_failure(copy) is classify_rollout_failure(exc)
    assert len(str(copy)) <= MAX_MESSAGE_CHARS
    statuses = [link.status for link in chain[:MAX_LINKS] if link.kind == "response"]
    first_single = next((link for link in chain[:MAX_LINKS] if link.kind != "group"), None)
    if statuses and first_single is not None and first_single.kind == "response":
        assert copy.status == first_single.status
    assert isinstance(failure_type(copy), str)
    assert failure_type(copy)


class _Hostile(Exception):
    """An exception whose every accessor misbehaves the way a third-party error might."""

    def __init__(self, status: object, text: object) -> None:
        super().__init__("hostile")
        self._status = status
        self._text = text

    def __str__(self) -> str:
        if isinstance(self._text, BaseException):
            raise self._text
        return str(self._text)

    def __getattribute__(self, name: str) -> Any:
        if name in ("status", "status_code", "response", "message"):
            value = object.__getattribute__(self, "_status")
            if isinstance(value, BaseException):
                raise value
            return value
        return object.__getattribute__(self, name)


hostile_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True),
    st.text(max_size=50),
    st.binary(max_size=20),
    st.sampled_from([ValueError("no status"), RecursionError("deep"), KeyError("status")]),
    st.builds(object),
)


@settings(max_examples=500, deadline=None)
@given(status=hostile_values, text=st.one_of(st.text(max_size=5000), st.sampled_from([ValueError("unprintable")])))
def test_hostile_exceptions_never_break_classification_or_conversion(status: object, text: object) -> None:
    """Whatever an exception's status, message and ``__str__`` do, classification returns a verdict and the
    conversion returns a bounded, picklable taxonomy member (it never raises)."""
    TALLY["test_hostile_exceptions_never_break_classification_or_conversion"] += 1
    exc = _Hostile(status, text)
    result = classify_rollout_failure(exc)
    assert isinstance(result, FailureClass)
    converted = to_picklable_failure(exc)
    copy = pickle.loads(pickle.dumps(converted))
    assert isinstance(copy, RolloutFailure)
    assert len(str(copy)) <= MAX_MESSAGE_CHARS
    assert classify_rollout_failure(copy) is result


@given(message=st.text(max_size=3000))
@settings(max_examples=200, deadline=None)
def test_run_terminal_errors_are_never_converted_or_called_infra(message: str) -> None:
    """RolloutRedispatchExhausted and RolloutStall pass conversion unchanged and are never INFRA (so no per-attempt
    loop retries them)."""
    TALLY["test_run_terminal_errors_are_never_converted_or_called_infra"] += 1
    for error in (RolloutRedispatchExhausted(message), RolloutStall(message)):
        assert to_picklable_failure(error) is error
        assert classify_rollout_failure(error) is FailureClass.DATA
