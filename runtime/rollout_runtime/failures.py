"""Rollout failure taxonomy: every failed attempt is either the fleet's fault or the prompt's.

The tree::

    Exception
     +-- RolloutFailure                  a single rollout attempt failed
     |    +-- RolloutInfraFailure        the fleet is sick; the prompt is fine -> redispatch elsewhere
     |    |    +-- RolloutTimeout        an attempt, turn or step exceeded its deadline
     |    |    +-- GenerationUnavailable the chosen generation shard could not serve
     |    |    +-- NoHealthyShards       no shard is eligible for traffic right now
     |    |    +-- GymTransportError     the environment server failed at the transport layer
     |    +-- RolloutDataFailure         the prompt itself cannot succeed -> small budget, reported loudly
     |         +-- RolloutTerminalDataFailure   ... and must not be retried even once
     +-- RuntimeError
          +-- RolloutRedispatchExhausted a prompt used up its infra budget (or no shard at all): the run ends
          +-- RolloutStall               in flight, yet nothing committed within the watchdog deadline
          +-- RolloutFleetMisconfigured  every shard answers most prompts the same way (401, wrong model): the run ends

The last three are terminal for the *run*, not for one attempt, which is why they are not RolloutFailures:
the per-attempt retry loop catches RolloutFailure and must never swallow them.

:func:`classify_rollout_failure` maps any exception onto :class:`FailureClass`. Anything it does not
recognise as infrastructure is DATA: an unknown exception is more likely a bug than a blip, and the data
path reports it with its reason instead of retrying it into silence.

Classify where the information still exists. An exception that crosses a process boundary (a Ray actor,
a multiprocessing worker) is pickled without its ``__cause__``, and anything unpicklable in it (aiohttp's
response headers, for one) makes Ray replace the whole error with a bare one that carries neither type nor
status; the driver is then guessing. :func:`to_picklable_failure` and the :func:`picklable_failures`
decorator convert a failure into a picklable member of this taxonomy *before* it crosses.

One walk reads a failure: the exception, its ``__cause__`` chain and its exception-group members, bounded and
cycle-safe. :func:`diagnose` returns everything a dispatcher decides from one failed attempt as a
:class:`Diagnosis` (class, type label, whether it blames the shard, whether it is terminal, the reason);
:func:`classify_rollout_failure`, :func:`failure_contains` and :func:`describe_failure` are views of the same walk.

One decision about HTTP statuses exists, :func:`http_status_is_infra`, and it is the first verdict for every client:
``GenerationClient``, the router, the environment client, the aiohttp/httpx/openai errors read here, and
``rollout-fleet classify``; the environment side's ``is_retryable_dependency_status`` calls it, so the generation and
environment sides can never drift apart. An answer that says "this shard or this fleet is wrong" (401, 403, 404, 407)
is DATA here like any other 4xx: one answer cannot say whether the prompt, the shard or the whole fleet is at fault.
The evidence across prompts and shards can, and ``dispatch/blame.py`` weighs it.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import aiohttp

from rollout_runtime import http_verdicts
from rollout_runtime.redaction import MAX_MESSAGE_CHARS, safe_message

__all__ = [
    "MAX_MESSAGE_CHARS",
    "Diagnosis",
    "FailureClass",
    "GenerationUnavailable",
    "GymTransportError",
    "NoHealthyShards",
    "RolloutBatchTooSmall",
    "RolloutDataFailure",
    "RolloutFailure",
    "RolloutFleetMisconfigured",
    "RolloutInfraFailure",
    "RolloutRedispatchExhausted",
    "RolloutStall",
    "RolloutTerminalDataFailure",
    "RolloutTimeout",
    "classify_rollout_failure",
    "describe_failure",
    "diagnose",
    "exception_text",
    "failure_contains",
    "failure_type",
    "http_status_is_infra",
    "picklable_failures",
    "to_picklable_failure",
]

_MAX_CAUSE_DEPTH: Final[int] = 8
"""Links of ``__cause__`` followed from each exception: real wrappers are shallow, cycles exist."""

_MAX_NODES: Final[int] = 64
"""Exceptions examined per classification, across exception groups: keeps classification O(1)."""


_RETRIABLE_HTTP_STATUSES: Final[frozenset[int]] = frozenset({408, 425, 429})
"""The 4xx statuses that describe the server's state, not the request: timeout, too early, too many."""


class RolloutFailure(Exception):
    """Base class for failures that terminate a single rollout attempt.

    ``status`` is the HTTP status behind the failure, if any; ``retry_after`` the seconds its Retry-After asked
    for; ``original_type`` names the exception this one was converted from at a process boundary (see
    :func:`to_picklable_failure`).
    """

    def __init__(
        self,
        message: str = "",
        *,
        status: int | None = None,
        original_type: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.original_type = original_type
        self.retry_after = retry_after


class RolloutInfraFailure(RolloutFailure):
    """The generation or environment infrastructure could not serve this rollout; redispatch it."""


class RolloutTimeout(RolloutInfraFailure):
    """A rollout, generation turn, or environment step exceeded its deadline."""


class GenerationUnavailable(RolloutInfraFailure):
    """The selected generation shard could not serve the request."""


class NoHealthyShards(RolloutInfraFailure):
    """No generation shard is currently eligible to serve traffic."""


class GymTransportError(RolloutInfraFailure):
    """The environment server failed at the transport layer rather than returning a rollout."""


class RolloutDataFailure(RolloutFailure):
    """This prompt cannot be rolled out, and another shard would fail identically.

    Usually configuration: a prompt longer than the engine's ``max_model_len``.
    """


class RolloutTerminalDataFailure(RolloutDataFailure):
    """A data failure that forbids any retry (an environment said so): the dispatcher stops at once."""


class RolloutRedispatchExhausted(RuntimeError):
    """A prompt exhausted its infrastructure retry budget: fleet-wide failure, terminal for the run."""


class RolloutStall(RuntimeError):
    """Rollouts are in flight but none has committed within the watchdog deadline."""


class RolloutBatchTooSmall(RuntimeError):
    """Too many of a run's prompts were given up on to keep ``min_step_batch_fraction`` of it: terminal for the run."""


class RolloutFleetMisconfigured(RuntimeError):
    """Every shard gives most prompts the same failure (a rotated API key, the wrong model): terminal for the run,
    with a message that names the answer and what to check."""


class FailureClass(str, enum.Enum):
    """Retry policy bucket for a failed rollout attempt."""

    INFRA = "infra"
    DATA = "data"


def http_status_is_infra(status: int) -> bool:
    """Whether an HTTP status means the endpoint is unwell rather than the request bad; a bool for every int.

    5xx and the retriable 4xx (408, 425, 429) are infrastructure. Any other 4xx describes the request, so
    another shard would answer it identically. A status below 400 surfacing as an error is a protocol
    mismatch (an unexpected redirect, a 200 with the wrong body), which no other shard fixes either. A status
    outside 100..599 is no HTTP status at all: the endpoint is broken (infra) from 600 up, as upstream's
    ``status >= 500`` reads it, and below 100 it is a protocol mismatch like the 1xx-3xx ones.

    401, 403, 404 and 407 are DATA like any other 4xx: whether a rejected key or a missing model is one shard's
    (eject it) or the whole fleet's (end the run) is not in one answer; the dispatcher's blame weighs the evidence.
    Public because the environment side makes this same call (``is_retryable_dependency_status``), and every client
    reads its answers with it: the copies of the decision must not drift apart.

    Raises only for a non-int (a string or float status is a caller's bug, and ``True`` is not a status).
    """
    if isinstance(status, bool) or not isinstance(status, int):
        raise ValueError(f"HTTP status must be an int, got {type(status).__name__}: {status!r}")
    return status >= 500 or status in _RETRIABLE_HTTP_STATUSES


# The infrastructure table. Types are matched with isinstance; names are matched over the MRO as well, within the
# package each name belongs to, so httpx's, openai's and Ray's errors classify without importing them (Ray is
# optional and slow to import) and a same-named class elsewhere (``tarfile.ReadError``) does not.
_AIOHTTP_INFRA_TYPES: Final[tuple[type[BaseException], ...]] = (
    aiohttp.ClientConnectionError,  # refused, reset, disconnected, DNS, TLS, ClientOSError (an OSError only)
    aiohttp.ClientPayloadError,  # body cut off mid-response
    aiohttp.ServerTimeoutError,
)
_CLIENT_RESPONSE_ERROR: Final[type[BaseException]] = aiohttp.ClientResponseError
_INFRA_TYPES: Final[tuple[type[BaseException], ...]] = (
    TimeoutError,  # asyncio.TimeoutError is TimeoutError since 3.11
    ConnectionError,
    RolloutInfraFailure,
    *_AIOHTTP_INFRA_TYPES,
)
_INFRA_TYPE_NAMES: Final[dict[str, frozenset[str]]] = {
    # Names are matched only inside the package they belong to: ``tarfile.ReadError`` is not httpx's ReadError.
    "aiohttp": frozenset(
        {
            "ClientConnectionError",
            "ClientConnectorError",
            "ClientOSError",
            "ClientPayloadError",
            "ServerConnectionError",
            "ServerDisconnectedError",
            "ServerTimeoutError",
            "ConnectionTimeoutError",
            "SocketTimeoutError",
        }
    ),
    # httpx (and httpcore under it) and the openai client, which many trainers use to reach their engines
    "httpx": frozenset(
        {"ConnectError", "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout", "ReadError", "WriteError"}
        | {"RemoteProtocolError", "NetworkError", "TimeoutException", "TransportError"}
    ),
    "httpcore": frozenset(
        {"ConnectError", "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout", "ReadError", "WriteError"}
        | {"RemoteProtocolError", "NetworkError", "TimeoutException"}
    ),
    "openai": frozenset({"APIConnectionError", "APITimeoutError"}),
    # Ray's table is upstream NeMo-RL's (nemo_rl/experience/failures.py), matched over the MRO as its isinstance
    # checks are (ActorDiedError is a RayActorError, ObjectReconstructionFailedError an ObjectLostError); those two
    # subclasses are named as well for a copy whose bases are not Ray's.
    "ray": frozenset(
        {
            "RayActorError",
            "ActorDiedError",
            "ObjectReconstructionFailedError",
            "ActorUnavailableError",
            "ActorUnschedulableError",
            "TaskUnschedulableError",
            "WorkerCrashedError",
            "NodeDiedError",
            "LocalRayletDiedError",
            "OwnerDiedError",
            "RpcError",
            "GetTimeoutError",
            "ObjectFetchTimedOutError",
            "ObjectLostError",
            "OutOfMemoryError",
            "ObjectStoreFullError",
            "RaySystemError",
        }
    ),
    # the taxonomy's own names, in any module: copies that lost their class identity, upstream NeMo-RL's classes
    "*": frozenset(
        {"RolloutInfraFailure", "RolloutTimeout", "GenerationUnavailable", "NoHealthyShards", "GymTransportError"}
    ),
}
_DATA_TYPE_NAMES: Final[dict[str, frozenset[str]]] = {
    "*": frozenset({"RolloutDataFailure", "RolloutTerminalDataFailure", "GymTerminalEpisodeFailure"})
}


def _http_status(exc: BaseException) -> int | None:
    """Return the HTTP status an error carries (aiohttp ``status``, openai ``status_code``, httpx ``response``)."""
    response = getattr(exc, "response", None)
    for value in (
        getattr(exc, "status", None),
        getattr(exc, "status_code", None),
        getattr(response, "status_code", None),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


_RESPONSE_ERROR_NAMES: Final[dict[str, frozenset[str]]] = {
    "aiohttp": frozenset({"ClientResponseError"}),
    "httpx": frozenset({"HTTPStatusError"}),
    "openai": frozenset({"APIStatusError"}),
}


def _named_in(table: dict[str, frozenset[str]], module: str, name: str) -> bool:
    """Whether ``name`` is one of the names ``table`` lists for the top-level package of ``module`` (or for any
    module, ``"*"``: the taxonomy's own names, which no other library uses)."""
    names = table.get(module.split(".", 1)[0])
    return (names is not None and name in names) or name in table.get("*", ())


class _TypeVerdict(enum.Enum):
    """What an exception's class alone says; computed once per class (see :func:`_verdict_of`)."""

    DATA = "data"  # an explicit data failure
    INFRA = "infra"
    RESPONSE = "response"  # an HTTP response error: the status decides
    UNKNOWN = "unknown"


_VERDICTS: dict[type[BaseException], _TypeVerdict] = {}
"""Per-class memo: exception classes are few, and a class's verdict never changes."""


def _verdict_of(cls: type[BaseException]) -> _TypeVerdict:
    verdict = _VERDICTS.get(cls)
    if verdict is None:
        if len(_VERDICTS) >= 4096:  # classes made on the fly (tests, proxies) must not grow it without bound
            _VERDICTS.clear()
        verdict = _VERDICTS[cls] = _class_verdict(cls)
    return verdict


def _class_verdict(cls: type[BaseException]) -> _TypeVerdict:
    """Classify a class by subclassing and by the names over its MRO (copies keep their names, not identity)."""
    names = [(str(c.__module__), c.__name__) for c in cls.__mro__]
    if issubclass(cls, RolloutDataFailure) or any(_named_in(_DATA_TYPE_NAMES, *name) for name in names):
        return _TypeVerdict.DATA
    if issubclass(cls, _CLIENT_RESPONSE_ERROR) or any(_named_in(_RESPONSE_ERROR_NAMES, *name) for name in names):
        return _TypeVerdict.RESPONSE
    if issubclass(cls, _INFRA_TYPES) or any(_named_in(_INFRA_TYPE_NAMES, *name) for name in names):
        return _TypeVerdict.INFRA
    return _TypeVerdict.UNKNOWN


def _is_infra(exc: BaseException) -> bool:
    """Return whether this single exception (ignoring its cause chain) is infra.

    A response error is judged by its status alone: a 400 from a healthy shard is the prompt's problem even
    though it arrived as a ``ClientResponseError``. One that carries no status falls back to its type.
    """
    verdict = _verdict_of(type(exc))
    if verdict is _TypeVerdict.RESPONSE:
        status = _http_status(exc)
        if status is not None:
            return http_status_is_infra(status)
        return issubclass(type(exc), _INFRA_TYPES)
    return verdict is _TypeVerdict.INFRA


def _retry_after(exc: BaseException) -> float | None:
    """Seconds a Retry-After asked for: ours carry it, foreign response errors in their (response's) headers."""
    value = getattr(exc, "retry_after", None)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    headers = getattr(exc, "headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    return http_verdicts.retry_after_seconds(headers) if headers is not None else None


def _admit(node: BaseException, seen: set[int]) -> bool:
    """Whether a walk that has met ``seen`` goes on to ``node``: not met before, and within the node budget."""
    return id(node) not in seen and len(seen) < _MAX_NODES


def _links(exc: BaseException, seen: set[int]) -> Iterator[BaseException]:
    """The exception and its explicit ``__cause__`` chain: bounded and cycle-safe."""
    node: BaseException | None = exc
    for _ in range(_MAX_CAUSE_DEPTH + 1):
        if node is None or not _admit(node, seen):
            return
        seen.add(id(node))
        yield node
        cause = getattr(node, "__cause__", None)
        node = cause if isinstance(cause, BaseException) else None


@dataclass(slots=True)
class _Trace:
    """What the walk met and what it concluded; every public reading of a failure is a view of one of these."""

    nodes: list[BaseException] = field(default_factory=list)
    """Every exception examined, in walk order: chain links and, recursively, group members."""
    chain: list[BaseException] = field(default_factory=list)
    """The exception and its cause chain, followed on its own terms: the links a description names."""
    data: bool = False
    """An explicit data failure was met (it wins)."""
    infra: bool = False
    """The chain rules say infrastructure (a group counts only when every member does)."""
    broken: bool = False
    """Something could not be examined (a hostile attribute, a broken ``__mro__``): the class is DATA."""

    @property
    def failure_class(self) -> FailureClass:
        return FailureClass.INFRA if self.infra and not self.data and not self.broken else FailureClass.DATA

    def contains(self, types: type[BaseException] | tuple[type[BaseException], ...]) -> bool:
        try:
            return any(isinstance(node, types) for node in self.nodes)
        except Exception:
            return False


def _walk(exc: BaseException) -> _Trace:
    """The one walk over a failure; never raises (what it met before a hostile link stands, the class is DATA).

    The cause chain is followed once. Its text view (``chain``) keeps following a link the group walk has already
    met as a member, or that lies past the node budget: a description names every cause in the chain.
    """
    trace = _Trace()
    seen: set[int] = set()
    judging = True
    try:
        for link in _links(exc, set()):
            trace.chain.append(link)
            judging = judging and _admit(link, seen)
            if not judging:
                continue
            seen.add(id(link))
            try:
                trace.infra = _judge(link, seen, trace, infra=trace.infra)
            except Exception:  # a group member's hostile __cause__: the judging stops, the text goes on
                trace.broken, judging = True, False
    except Exception:  # a hostile __cause__ in the chain itself
        trace.broken = True
    return trace


def _follow(exc: BaseException, seen: set[int], trace: _Trace) -> bool:
    """Walk a group member's chain into ``trace``; return whether that chain is infrastructure."""
    infra = False
    for link in _links(exc, seen):
        infra = _judge(link, seen, trace, infra=infra)
    return infra


def _judge(link: BaseException, seen: set[int], trace: _Trace, *, infra: bool) -> bool:
    """Fold one chain link (and a group's members) into ``trace``; return the chain's infra verdict so far."""
    trace.nodes.append(link)
    if isinstance(link, BaseExceptionGroup):
        members = [_follow(member, seen, trace) for member in link.exceptions]
        return infra or (bool(members) and all(members))
    try:
        if _verdict_of(type(link)) is _TypeVerdict.DATA:
            trace.data = True
        elif not infra:
            return _is_infra(link)
    except Exception:  # a hostile __getattr__, a broken __mro__: never let classification take the loop down
        trace.broken = True
    return infra


_SPARE_THE_SHARD: Final[tuple[type[BaseException], ...]] = (GymTransportError, NoHealthyShards)
"""Infra failures that say nothing about the generation shard: the environment side's, and "no shard at all"."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Every verdict on one failed attempt, read in one walk (see :func:`diagnose`).

    A dispatcher acts on these fields and never re-reads the exception: a new per-attempt verdict belongs here,
    computed from the walk, so that every consumer sees the same answer.
    """

    failure_class: FailureClass
    failure_type: str
    """The class name to report (the original one for a converted failure): the ``failure_type`` label."""
    blames_shard: bool
    """INFRA, and nothing in it puts the fault elsewhere (:class:`GymTransportError`, :class:`NoHealthyShards`)."""
    terminal: bool
    """A :class:`RolloutTerminalDataFailure` is in it: do not retry, not even once."""
    reason: str
    """The message with the causes that explain it (vLLM's 400 body lands here), redacted and bounded."""
    status: int | None = None
    """The HTTP status a shard answered with, if the failure carries one: the shard is alive and answered, which is
    the evidence blame weighs (``dispatch/blame.py``)."""
    retry_after: float | None = None
    """Seconds the answer's Retry-After asked for, if any."""

    @property
    def backpressure(self) -> bool:
        """429, or 503 with a Retry-After: the shard is busy, not broken."""
        return self.failure_class is FailureClass.INFRA and http_verdicts.is_backpressure(self.status, self.retry_after)


def diagnose(exc: BaseException) -> Diagnosis:
    """Read a failed attempt once: its class, type label, whether it blames the shard, terminal, and reason.

    The class follows :func:`classify_rollout_failure`'s rules; ``terminal`` and ``blames_shard`` look at the same
    exceptions as :func:`failure_contains`; ``reason`` is :func:`describe_failure`, redacted and bounded.
    """
    trace = _walk(exc)
    failure_class = trace.failure_class
    status: int | None = None
    retry_after: float | None = None
    try:
        for link in trace.chain:
            status = _http_status(link)
            if status is not None:
                retry_after = _retry_after(link)
                break
    except Exception:
        status = retry_after = None
    return Diagnosis(
        failure_class=failure_class,
        failure_type=failure_type(exc),
        blames_shard=failure_class is FailureClass.INFRA and not trace.contains(_SPARE_THE_SHARD),
        terminal=trace.contains(RolloutTerminalDataFailure),
        reason=safe_message(_describe(exc, trace.chain, name_head=True)),
        status=status,
        retry_after=retry_after,
    )


def failure_contains(exc: BaseException, types: type[BaseException] | tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc``, its causes or its group members include one of ``types``; bounded like classification.

    For decisions beside the class, e.g. "a terminal data failure is in there: do not retry" or "the environment
    failed, not the generation shard: do not eject it". Never raises.
    """
    return _walk(exc).contains(types)


def classify_rollout_failure(exc: BaseException) -> FailureClass:
    """Bucket a rollout exception into ``INFRA`` or ``DATA``; never raises.

    Rules, in order:

    1. An explicit :class:`RolloutDataFailure` anywhere in the chain (or in a group) wins: callers that know
       a failure is prompt-specific can say so and not have it re-read as infrastructure.
    2. The exception and its ``__cause__`` chain (``_MAX_CAUSE_DEPTH`` links, cycle-safe) are checked
       against the infrastructure table; an HTTP response error by its status. Implicit ``__context__``
       ("another error happened while handling this one") is not followed: it is not a cause.
    3. An exception group is INFRA only when every member is: one unexplained member may be a bug, and
       bugs must be loud. An empty group is DATA.
    4. Anything else is DATA.
    """
    return _walk(exc).failure_class


def failure_type(exc: BaseException) -> str:
    """The class name to report for a failure: the original one for a converted failure."""
    original = getattr(exc, "original_type", None)
    if isinstance(exc, RolloutFailure) and isinstance(original, str) and original:
        return original.rsplit(".", 1)[-1]
    return type(exc).__name__


def exception_text(exc: BaseException) -> str:
    """The exception's text, never raising; for an HTTP response error, its status and the server's own message."""
    try:
        status, message = _http_status(exc), getattr(exc, "message", None)
        if status is not None and isinstance(message, str) and not isinstance(exc, RolloutFailure):
            return f"HTTP {status}: {message}" if message else f"HTTP {status}"
        return str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"


def _is_ours(exc: BaseException) -> bool:
    return isinstance(exc, RolloutFailure) and type(exc).__module__ == __name__


def describe_failure(exc: BaseException, *, name_head: bool = True) -> str:
    """One line: the exception and the causes that explain it (``Outer: text <- Cause: text``), for ledgers.

    Unbounded and unredacted: callers bound it, and redact it where it leaves the process.
    """
    return _describe(exc, _walk(exc).chain, name_head=name_head)


def _describe(exc: BaseException, chain: list[BaseException], *, name_head: bool) -> str:
    parts: list[str] = []
    for link in chain:
        text = exception_text(link)
        named = name_head or link is not exc
        parts.append(f"{failure_type(link)}: {text}" if named and text else text if text else failure_type(link))
    return " <- ".join(parts)


def to_picklable_failure(exc: BaseException) -> BaseException:
    """Convert a failure into a picklable taxonomy member that classifies exactly as ``exc`` does.

    Keeps the original class (``original_type``), the HTTP status, and a bounded message that includes
    the cause chain (which pickling would otherwise drop). The run-terminal errors
    (:class:`RolloutRedispatchExhausted`, :class:`RolloutStall`) pass through unchanged.
    """
    if isinstance(exc, RolloutRedispatchExhausted | RolloutStall | RolloutFleetMisconfigured):
        return exc
    if _is_ours(exc) and exc.__cause__ is None and len(exception_text(exc)) <= MAX_MESSAGE_CHARS:
        return exc  # already a plain, picklable taxonomy member: converting again would only re-wrap its text
    try:
        trace = _walk(exc)
        carrier = next((link for link in trace.chain if _http_status(link) is not None), None)
        status = _http_status(carrier) if carrier is not None else None
        retry_after = _retry_after(carrier) if carrier is not None else None
        original = getattr(exc, "original_type", None) if isinstance(exc, RolloutFailure) else None
        original_type = original if isinstance(original, str) else f"{type(exc).__module__}.{type(exc).__qualname__}"
        message = safe_message(_describe(exc, trace.chain, name_head=not _is_ours(exc)))  # ours names itself
        target = _converted_type(exc, trace)
        return target(message, status=status, original_type=original_type, retry_after=retry_after)
    except Exception:
        return RolloutDataFailure(f"unconvertible {type(exc).__name__}", original_type=type(exc).__name__)


def _converted_type(exc: BaseException, trace: _Trace) -> type[RolloutFailure]:
    if trace.failure_class is FailureClass.DATA:
        # Data wins anywhere in the chain; keep the most specific data class we can see.
        if any(isinstance(link, RolloutTerminalDataFailure) for link in trace.chain):
            return RolloutTerminalDataFailure
        return RolloutDataFailure
    if isinstance(exc, RolloutInfraFailure):
        return type(exc) if type(exc).__module__ == __name__ else RolloutInfraFailure
    if isinstance(exc, TimeoutError):
        return RolloutTimeout
    return RolloutInfraFailure


F = TypeVar("F", bound=Callable[..., Any])


def picklable_failures(func: F) -> F:
    """Decorate a Ray actor method or worker function so every failure leaves it already classified.

    Works on plain and ``async`` functions. Cancellation and interpreter exits are not failures and pass.
    """
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await func(*args, **kwargs)
            except Exception as exc:
                raise to_picklable_failure(exc) from None

        return cast(F, async_wrapper)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            raise to_picklable_failure(exc) from None

    return cast(F, wrapper)
