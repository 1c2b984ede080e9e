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
          +-- RolloutRedispatchExhausted a prompt used up its infra budget: the run ends
          +-- RolloutStall               in flight, yet nothing committed within the watchdog deadline

The last two are terminal for the *run*, not for one attempt, which is why they are not RolloutFailures:
the per-attempt retry loop catches RolloutFailure and must never swallow them.

:func:`classify_rollout_failure` maps any exception onto :class:`FailureClass`. Anything it does not
recognise as infrastructure is DATA: an unknown exception is more likely a bug than a blip, and the data
path reports it with its reason instead of retrying it into silence.

Classify where the information still exists. An exception that crosses a process boundary (a Ray actor,
a multiprocessing worker) is pickled without its ``__cause__``, and anything unpicklable in it (aiohttp's
response headers, for one) makes Ray replace the whole error with a bare one that carries neither type nor
status; the driver is then guessing. :func:`to_picklable_failure` and the :func:`picklable_failures`
decorator convert a failure into a picklable member of this taxonomy *before* it crosses.

One decision about HTTP statuses exists, :func:`http_status_is_infra`; the environment side's
``is_retryable_dependency_status`` calls it, so the generation and environment sides can never drift apart.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar, cast

import aiohttp

from rollout_runtime.redaction import MAX_MESSAGE_CHARS, safe_message

__all__ = [
    "MAX_MESSAGE_CHARS",
    "FailureClass",
    "GenerationUnavailable",
    "GymTransportError",
    "NoHealthyShards",
    "RolloutDataFailure",
    "RolloutFailure",
    "RolloutInfraFailure",
    "RolloutRedispatchExhausted",
    "RolloutStall",
    "RolloutTerminalDataFailure",
    "RolloutTimeout",
    "classify_rollout_failure",
    "describe_failure",
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

    ``status`` is the HTTP status behind the failure, if any; ``original_type`` names the exception this
    one was converted from at a process boundary (see :func:`to_picklable_failure`).
    """

    def __init__(self, message: str = "", *, status: int | None = None, original_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.original_type = original_type


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


class FailureClass(str, enum.Enum):
    """Retry policy bucket for a failed rollout attempt."""

    INFRA = "infra"
    DATA = "data"


def http_status_is_infra(status: int) -> bool:
    """Whether an HTTP status means the endpoint is unwell rather than the request bad.

    5xx and the retriable 4xx (408, 425, 429) are infrastructure. Any other 4xx describes the request, so
    another shard would answer it identically. A status below 400 surfacing as an error is a protocol
    mismatch (an unexpected redirect, a 200 with the wrong body), which no other shard fixes either.
    """
    if isinstance(status, bool) or not isinstance(status, int):
        raise ValueError(f"HTTP status must be an int, got {type(status).__name__}: {status!r}")
    if not 100 <= status <= 599:
        raise ValueError(f"HTTP status must be within 100..599, got {status}")
    return status >= 500 or status in _RETRIABLE_HTTP_STATUSES


# The infrastructure table. Types are matched with isinstance; names are matched over the MRO as well, so a
# copy of an aiohttp error re-raised from another module or unpickled elsewhere still classifies. Ray is never
# imported (it is optional and slow to import): its errors are matched by name within the ``ray`` package.
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
_INFRA_TYPE_NAMES: Final[frozenset[str]] = frozenset(
    {
        # aiohttp
        "ClientConnectionError",
        "ClientConnectorError",
        "ClientOSError",
        "ClientPayloadError",
        "ServerConnectionError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "ConnectionTimeoutError",
        "SocketTimeoutError",
        # httpx and the openai client, which many trainers use to reach their engines
        "ConnectError",
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "ReadError",
        "RemoteProtocolError",
        "APIConnectionError",
        "APITimeoutError",
        # ours, for copies that lost their class identity
        "RolloutInfraFailure",
        "RolloutTimeout",
        "GenerationUnavailable",
        "NoHealthyShards",
        "GymTransportError",
    }
)
_RAY_INFRA_TYPE_NAMES: Final[frozenset[str]] = frozenset(
    {
        "RayActorError",
        "ActorDiedError",
        "ActorUnavailableError",
        "ActorUnschedulableError",
        "WorkerCrashedError",
        "NodeDiedError",
        "OwnerDiedError",
        "RpcError",
        "GetTimeoutError",
        "ObjectFetchTimedOutError",
        "OutOfMemoryError",
        "ObjectStoreFullError",
        "ObjectLostError",
        "ObjectReconstructionFailedError",
        "RaySystemError",
    }
)
_DATA_TYPE_NAMES: Final[frozenset[str]] = frozenset({"RolloutDataFailure", "RolloutTerminalDataFailure"})


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


_RESPONSE_ERROR_NAMES: Final[frozenset[str]] = frozenset({"ClientResponseError", "HTTPStatusError", "APIStatusError"})


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
    names = [(c.__module__, c.__name__) for c in cls.__mro__]
    if issubclass(cls, RolloutDataFailure) or any(name in _DATA_TYPE_NAMES for _, name in names):
        return _TypeVerdict.DATA
    if issubclass(cls, _CLIENT_RESPONSE_ERROR) or any(name in _RESPONSE_ERROR_NAMES for _, name in names):
        return _TypeVerdict.RESPONSE
    if issubclass(cls, _INFRA_TYPES):
        return _TypeVerdict.INFRA
    for module, name in names:
        if name in _INFRA_TYPE_NAMES or (name in _RAY_INFRA_TYPE_NAMES and module.split(".", 1)[0] == "ray"):
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


def _links(exc: BaseException, seen: set[int]) -> Iterator[BaseException]:
    """The exception and its explicit ``__cause__`` chain: bounded and cycle-safe."""
    node: BaseException | None = exc
    for _ in range(_MAX_CAUSE_DEPTH + 1):
        if node is None or id(node) in seen or len(seen) >= _MAX_NODES:
            return
        seen.add(id(node))
        yield node
        cause = getattr(node, "__cause__", None)
        node = cause if isinstance(cause, BaseException) else None


def _scan(exc: BaseException, seen: set[int]) -> tuple[bool, bool]:
    """One pass over the chain (and groups): (an explicit data failure was seen, an infra link was seen)."""
    infra = False
    for link in _links(exc, seen):
        if isinstance(link, BaseExceptionGroup):
            members = [_scan(member, seen) for member in link.exceptions]
            if any(data for data, _ in members):
                return True, infra
            infra = infra or (bool(members) and all(member_infra for _, member_infra in members))
        elif _verdict_of(type(link)) is _TypeVerdict.DATA:
            return True, infra
        elif not infra:
            infra = _is_infra(link)
    return False, infra


def _nodes(exc: BaseException, seen: set[int]) -> Iterator[BaseException]:
    """Every exception classification looks at: the cause chain and, recursively, exception-group members."""
    for link in _links(exc, seen):
        yield link
        if isinstance(link, BaseExceptionGroup):
            for member in link.exceptions:
                yield from _nodes(member, seen)


def failure_contains(exc: BaseException, types: type[BaseException] | tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc``, its causes or its group members include one of ``types``; bounded like classification.

    For decisions beside the class, e.g. "a terminal data failure is in there: do not retry" or "the environment
    failed, not the generation shard: do not eject it". Never raises.
    """
    try:
        return any(isinstance(node, types) for node in _nodes(exc, set()))
    except Exception:
        return False


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
    try:
        data, infra = _scan(exc, set())
        return FailureClass.INFRA if infra and not data else FailureClass.DATA
    except Exception:  # a hostile __getattr__, a broken __mro__: never let classification take the loop down
        return FailureClass.DATA


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
    parts: list[str] = []
    for link in _links(exc, set()):
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
    if isinstance(exc, RolloutRedispatchExhausted | RolloutStall):
        return exc
    if _is_ours(exc) and exc.__cause__ is None and len(exception_text(exc)) <= MAX_MESSAGE_CHARS:
        return exc  # already a plain, picklable taxonomy member: converting again would only re-wrap its text
    try:
        status = next((s for s in (_http_status(link) for link in _links(exc, set())) if s is not None), None)
        original = getattr(exc, "original_type", None) if isinstance(exc, RolloutFailure) else None
        original_type = original if isinstance(original, str) else f"{type(exc).__module__}.{type(exc).__qualname__}"
        message = safe_message(describe_failure(exc, name_head=not _is_ours(exc)))  # our own class already names itself
        target = _converted_type(exc, classify_rollout_failure(exc))
        return target(message, status=status, original_type=original_type)
    except Exception:
        return RolloutDataFailure(f"unconvertible {type(exc).__name__}", original_type=type(exc).__name__)


def _converted_type(exc: BaseException, failure_class: FailureClass) -> type[RolloutFailure]:
    if failure_class is FailureClass.DATA:
        # Data wins anywhere in the chain; keep the most specific data class we can see.
        for link in _links(exc, set()):
            if isinstance(link, RolloutTerminalDataFailure):
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
