"""The failure taxonomy: what is infra, what is data, and why."""

from __future__ import annotations

import asyncio
import itertools
import pickle

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_runtime import failures
from rollout_runtime.failures import (
    Diagnosis,
    FailureClass,
    GenerationUnavailable,
    GymTransportError,
    NoHealthyShards,
    RolloutDataFailure,
    RolloutFailure,
    RolloutInfraFailure,
    RolloutRedispatchExhausted,
    RolloutStall,
    RolloutTerminalDataFailure,
    RolloutTimeout,
    classify_rollout_failure,
    describe_failure,
    diagnose,
    failure_contains,
    failure_type,
    http_status_is_infra,
    picklable_failures,
    to_picklable_failure,
)
from rollout_runtime.redaction import safe_message

INFRA, DATA = FailureClass.INFRA, FailureClass.DATA


def response_error(status: int, message: str = "") -> aiohttp.ClientResponseError:
    return aiohttp.ClientResponseError(request_info=None, history=(), status=status, message=message)  # type: ignore[arg-type]


def chain(*excs: BaseException) -> BaseException:
    """chain(a, b, c) is ``a`` caused by ``b`` caused by ``c``."""
    for outer, inner in itertools.pairwise(excs):
        outer.__cause__ = inner
    return excs[0]


# --- the hierarchy -----------------------------------------------------------------------------------------------


def test_hierarchy_matches_the_seed() -> None:
    for infra in (RolloutTimeout, GenerationUnavailable, NoHealthyShards, GymTransportError):
        assert issubclass(infra, RolloutInfraFailure)
    assert issubclass(RolloutInfraFailure, RolloutFailure)
    assert issubclass(RolloutDataFailure, RolloutFailure)
    assert issubclass(RolloutTerminalDataFailure, RolloutDataFailure)


@pytest.mark.parametrize("run_terminal", [RolloutRedispatchExhausted, RolloutStall])
def test_run_terminal_errors_escape_the_per_attempt_loop(run_terminal: type[RuntimeError]) -> None:
    """The per-attempt loop catches RolloutFailure; run-terminal errors must fly past it."""
    assert issubclass(run_terminal, RuntimeError)
    assert not issubclass(run_terminal, RolloutFailure)
    with pytest.raises(run_terminal):
        try:
            raise run_terminal("fleet is gone")
        except RolloutFailure:  # pragma: no cover - the point is that this never matches
            pytest.fail("a run-terminal error was caught as an attempt failure")


def test_failure_class_is_a_string_enum() -> None:
    assert FailureClass.INFRA == "infra"
    assert FailureClass.DATA == "data"
    assert FailureClass("infra") is FailureClass.INFRA


# --- http_status_is_infra ------------------------------------------------------------------------------------------


def test_every_status_is_classified_by_the_documented_table() -> None:
    """Every status in 100..599 at once: 5xx and the retriable 4xx (408, 425, 429) are infra, nothing else is."""
    infra = {status for status in range(100, 600) if http_status_is_infra(status)}
    assert infra == {408, 425, 429, *range(500, 600)}


@given(st.integers())
def test_every_int_status_gets_a_bool(status: int) -> None:
    """Outside 100..599 too: a bool, never an exception (600 and up read as infra, as upstream's ``>= 500``)."""
    assert http_status_is_infra(status) is (status >= 500 or status in {408, 425, 429})


@pytest.mark.parametrize("status", ["503", 503.0, None, True])
def test_non_int_status_is_rejected(status: object) -> None:
    with pytest.raises(ValueError, match="must be an int"):
        http_status_is_infra(status)  # type: ignore[arg-type]


# --- classify_rollout_failure: single exceptions -------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError(),
        ConnectionRefusedError(),
        ConnectionResetError(),
        BrokenPipeError(),
        RolloutTimeout("slow"),
        GenerationUnavailable("down"),
        NoHealthyShards("none"),
        GymTransportError("env gone"),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientOSError(104, "reset"),  # an OSError but not a ConnectionError
        aiohttp.ClientPayloadError("truncated"),
        aiohttp.ServerTimeoutError("read timeout"),
        aiohttp.ConnectionTimeoutError("connect timeout"),
        aiohttp.SocketTimeoutError("sock read"),
        response_error(503),
        response_error(500),
        response_error(429),
        response_error(408),
        response_error(425),
    ],
    ids=lambda e: f"{type(e).__name__}{getattr(e, 'status', '')}",
)
def test_infra_table(exc: BaseException) -> None:
    assert classify_rollout_failure(exc) is INFRA


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad"),
        KeyError("reward"),
        RuntimeError("boom"),
        OSError("disk"),
        response_error(400, "maximum context length is 4096 tokens"),
        response_error(422),
        response_error(200),
        RolloutDataFailure("too long"),
        RolloutTerminalDataFailure("forbidden"),
        aiohttp.InvalidURL("nope"),
    ],
    ids=lambda e: f"{type(e).__name__}{getattr(e, 'status', '')}",
)
def test_everything_else_is_data(exc: BaseException) -> None:
    assert classify_rollout_failure(exc) is DATA


async def test_asyncio_timeouts_are_infra() -> None:
    with pytest.raises(TimeoutError) as info:
        async with asyncio.timeout(0):
            await asyncio.Event().wait()
    assert classify_rollout_failure(info.value) is INFRA
    with pytest.raises(TimeoutError) as info:
        await asyncio.wait_for(asyncio.Event().wait(), timeout=0)
    assert classify_rollout_failure(info.value) is INFRA


@pytest.mark.parametrize("status", [401, 403, 404, 407])
def test_credential_and_not_found_answers_are_data_through_any_client(status: int) -> None:
    """The seed's first verdict, as for any 4xx: whether the shard or the fleet is wrong is blame's to weigh."""
    assert classify_rollout_failure(response_error(status)) is DATA


def test_response_error_is_judged_by_status_not_type() -> None:
    assert classify_rollout_failure(response_error(502)) is INFRA
    assert classify_rollout_failure(response_error(400)) is DATA


def test_foreign_status_errors_are_judged_by_status() -> None:
    """httpx/openai-style errors carry ``status_code`` or ``response.status_code``."""

    class APIStatusError(Exception):
        __module__ = "openai"

        def __init__(self, status_code: int) -> None:
            self.status_code = status_code

    class Response:
        status_code = 503

    class HTTPStatusError(Exception):
        __module__ = "httpx"
        response = Response()

    assert classify_rollout_failure(APIStatusError(500)) is INFRA
    assert classify_rollout_failure(APIStatusError(400)) is DATA
    assert classify_rollout_failure(HTTPStatusError()) is INFRA


def test_copies_are_matched_by_class_name_within_their_library() -> None:
    """A re-declared copy inside the library (another aiohttp version, a vendored copy) still classifies."""
    copy = type("ServerDisconnectedError", (Exception,), {"__module__": "aiohttp.client_exceptions"})
    assert classify_rollout_failure(copy()) is INFRA


@pytest.mark.parametrize("module", ["tarfile", "shutil", "myapp.io"])
def test_a_library_name_elsewhere_is_not_infra(module: str) -> None:
    """``tarfile.ReadError`` and ``shutil.ReadError`` are not httpx's ReadError: a corrupt archive is the data's."""
    impostor = type("ReadError", (Exception,), {"__module__": module})
    assert classify_rollout_failure(impostor()) is DATA


def test_real_tarfile_and_shutil_read_errors_are_data() -> None:
    import shutil
    import tarfile

    assert classify_rollout_failure(tarfile.ReadError("not a gzip file")) is DATA
    assert classify_rollout_failure(shutil.ReadError("bad archive")) is DATA


_UPSTREAM_RAY_INFRA = [
    "RayActorError",
    "ActorDiedError",
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
    "ObjectReconstructionFailedError",
    "OutOfMemoryError",
    "ObjectStoreFullError",
    "RaySystemError",
]


@pytest.mark.parametrize("name", _UPSTREAM_RAY_INFRA)
def test_ray_table_is_upstream_nemo_rls(name: str) -> None:
    """Every class upstream's isinstance table catches (the listed ones and their subclasses) is infra here."""
    ray_exceptions = pytest.importorskip("ray.exceptions")
    cls = getattr(ray_exceptions, name)
    exc = cls.__new__(cls)
    assert classify_rollout_failure(exc) is INFRA


def test_ray_errors_upstream_leaves_out_are_data() -> None:
    ray_exceptions = pytest.importorskip("ray.exceptions")
    for name in ("TaskCancelledError", "RuntimeEnvSetupError", "RayTaskError"):
        cls = getattr(ray_exceptions, name)
        assert classify_rollout_failure(cls.__new__(cls)) is DATA, name


def test_ray_errors_are_matched_by_name_only_inside_ray() -> None:
    ray_error = type("ActorDiedError", (Exception,), {"__module__": "ray.exceptions"})
    impostor = type("OutOfMemoryError", (Exception,), {"__module__": "torch.cuda"})
    assert classify_rollout_failure(ray_error()) is INFRA
    assert classify_rollout_failure(impostor()) is DATA


# --- cause chains --------------------------------------------------------------------------------------------------


def test_infra_under_a_wrapper_is_infra() -> None:
    assert classify_rollout_failure(chain(RuntimeError("generation failed"), ConnectionResetError())) is INFRA


def test_infra_beyond_the_depth_bound_is_not_seen() -> None:
    depth = failures._MAX_CAUSE_DEPTH
    within = chain(*[RuntimeError(str(i)) for i in range(depth)], TimeoutError())
    beyond = chain(*[RuntimeError(str(i)) for i in range(depth + 1)], TimeoutError())
    assert classify_rollout_failure(within) is INFRA
    assert classify_rollout_failure(beyond) is DATA


def test_cycles_terminate() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert classify_rollout_failure(a) is DATA
    c = TimeoutError()
    d = RuntimeError("d")
    c.__cause__, d.__cause__ = d, c
    assert classify_rollout_failure(d) is INFRA


def test_explicit_data_failure_wins_over_an_infra_cause() -> None:
    assert classify_rollout_failure(chain(RolloutDataFailure("bad prompt"), TimeoutError())) is DATA
    assert classify_rollout_failure(chain(GenerationUnavailable("x"), RolloutDataFailure("bad"))) is DATA


def test_implicit_context_is_not_a_cause() -> None:
    try:
        try:
            raise ConnectionResetError
        except ConnectionResetError:
            raise KeyError("bug in the handler") from None
    except KeyError as exc:
        assert classify_rollout_failure(exc) is DATA
    try:
        try:
            raise ConnectionResetError
        except ConnectionResetError:
            raise KeyError("bug in the handler")  # noqa: B904 - implicit context is the case under test
    except KeyError as exc:
        assert exc.__context__ is not None
        assert classify_rollout_failure(exc) is DATA


# --- exception groups ----------------------------------------------------------------------------------------------


def test_group_of_infra_is_infra() -> None:
    assert classify_rollout_failure(ExceptionGroup("g", [TimeoutError(), ConnectionResetError()])) is INFRA


def test_group_with_an_unexplained_member_is_data() -> None:
    assert classify_rollout_failure(ExceptionGroup("g", [TimeoutError(), KeyError("bug")])) is DATA


def test_group_with_explicit_data_is_data() -> None:
    assert classify_rollout_failure(ExceptionGroup("g", [TimeoutError(), RolloutDataFailure("bad")])) is DATA


def test_nested_groups_and_group_causes() -> None:
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [TimeoutError()]), ConnectionResetError()])
    assert classify_rollout_failure(nested) is INFRA
    assert classify_rollout_failure(chain(RuntimeError("wrap"), nested)) is INFRA


# --- robustness ----------------------------------------------------------------------------------------------------


class Hostile(Exception):
    """An exception whose every introspection raises."""

    def __getattribute__(self, name: str) -> object:
        if name in ("__class__",):
            return object.__getattribute__(self, name)
        raise RuntimeError(f"no {name} for you")

    def __str__(self) -> str:
        raise RuntimeError("no str either")


def test_classification_never_raises_on_hostile_exceptions() -> None:
    assert classify_rollout_failure(Hostile()) is DATA
    converted = to_picklable_failure(Hostile())
    assert classify_rollout_failure(converted) is DATA
    pickle.loads(pickle.dumps(converted))


# --- conversion at a process boundary ------------------------------------------------------------------------------


def test_converted_failure_keeps_type_status_and_causes() -> None:
    original = chain(RuntimeError("generation failed"), response_error(503, "Service Unavailable"))
    converted = to_picklable_failure(original)
    assert isinstance(converted, RolloutInfraFailure)
    assert converted.status == 503
    assert converted.original_type == "builtins.RuntimeError"
    assert "generation failed" in str(converted)
    assert "ClientResponseError" in str(converted)
    assert failure_type(converted) == "RuntimeError"


def test_converted_timeout_stays_a_timeout() -> None:
    assert type(to_picklable_failure(TimeoutError())) is RolloutTimeout


def test_converted_terminal_data_failure_stays_terminal() -> None:
    converted = to_picklable_failure(chain(RuntimeError("wrap"), RolloutTerminalDataFailure("no retries")))
    assert type(converted) is RolloutTerminalDataFailure


def test_converted_message_is_bounded() -> None:
    converted = to_picklable_failure(ValueError("x" * 10_000))
    assert len(str(converted)) <= failures.MAX_MESSAGE_CHARS


def test_run_terminal_errors_pass_through_conversion() -> None:
    stall = RolloutStall("stuck")
    assert to_picklable_failure(stall) is stall


def test_unpicklable_response_error_converts_to_a_picklable_one() -> None:
    from multidict import CIMultiDict, CIMultiDictProxy

    exc = aiohttp.ClientResponseError(
        request_info=None,  # type: ignore[arg-type]
        history=(),
        status=503,
        headers=CIMultiDictProxy(CIMultiDict({"Retry-After": "1"})),
    )
    with pytest.raises((TypeError, pickle.PicklingError)):
        pickle.dumps(exc)
    restored = pickle.loads(pickle.dumps(to_picklable_failure(exc)))
    assert classify_rollout_failure(restored) is INFRA
    assert restored.status == 503


def test_decorator_converts_sync_failures() -> None:
    @picklable_failures
    def work() -> None:
        raise RuntimeError("wrapped") from ConnectionResetError()

    with pytest.raises(RolloutInfraFailure) as info:
        work()
    assert info.value.__cause__ is None
    assert classify_rollout_failure(pickle.loads(pickle.dumps(info.value))) is INFRA


async def test_decorator_converts_async_failures_and_keeps_results() -> None:
    @picklable_failures
    async def ok() -> int:
        return 7

    @picklable_failures
    async def broken() -> None:
        raise response_error(400, "maximum context length")

    assert await ok() == 7
    with pytest.raises(RolloutDataFailure):
        await broken()


async def test_decorator_lets_cancellation_through() -> None:
    @picklable_failures
    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await cancelled()


# --- properties ----------------------------------------------------------------------------------------------------

LEAVES: list[type[BaseException]] = [
    TimeoutError,
    ConnectionResetError,
    ValueError,
    KeyError,
    RuntimeError,
    OSError,
    RolloutDataFailure,
    RolloutTerminalDataFailure,
    GenerationUnavailable,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError,
]


@st.composite
def exceptions(draw: st.DrawFn, depth: int = 3) -> BaseException:
    kind = draw(st.sampled_from(["leaf", "status", "group"] if depth > 0 else ["leaf", "status"]))
    if kind == "status":
        exc: BaseException = response_error(draw(st.integers(100, 599)), draw(st.text(max_size=20)))
    elif kind == "group":
        members = draw(st.lists(exceptions(depth=depth - 1), min_size=1, max_size=3))
        exc = ExceptionGroup("g", [m for m in members if isinstance(m, Exception)] or [ValueError()])
    else:
        exc = draw(st.sampled_from(LEAVES))(draw(st.text(max_size=20)))
    if depth > 0 and draw(st.booleans()):
        exc.__cause__ = draw(exceptions(depth=depth - 1))
    if draw(st.integers(0, 9)) == 0:
        exc.__cause__ = exc  # a cycle
    return exc


@given(exceptions())
def test_classification_is_total_and_deterministic(exc: BaseException) -> None:
    """For any exception graph, classification returns a FailureClass and returns the same one every time."""
    first = classify_rollout_failure(exc)
    assert isinstance(first, FailureClass)
    assert classify_rollout_failure(exc) is first


@given(exceptions())
def test_conversion_always_pickles_and_classifies_identically(exc: BaseException) -> None:
    """Whatever crosses a boundary classifies on the other side exactly as it did before crossing."""
    converted = to_picklable_failure(exc)
    restored = pickle.loads(pickle.dumps(converted))
    assert classify_rollout_failure(restored) is classify_rollout_failure(exc)
    assert type(restored) is type(converted)
    assert len(str(restored)) <= failures.MAX_MESSAGE_CHARS


def test_conversion_is_idempotent_and_does_not_repeat_the_type() -> None:
    """Converting twice (a client converts, then a decorator does) must not stack "Type: Type: ..." prefixes."""
    once = to_picklable_failure(RolloutTerminalDataFailure("environment said no"))
    twice = to_picklable_failure(once)
    assert twice is once
    assert str(once) == "environment said no"
    wrapped = to_picklable_failure(chain(RuntimeError("outer"), GymTransportError("env down")))
    assert str(wrapped) == "RuntimeError: outer <- GymTransportError: env down"


def test_failure_contains_walks_causes_and_groups_within_bounds() -> None:
    from rollout_runtime.failures import failure_contains

    nested = chain(RuntimeError("outer"), ExceptionGroup("g", [ValueError(), chain(KeyError(), GymTransportError())]))
    assert failure_contains(nested, GymTransportError)
    assert failure_contains(nested, (TimeoutError, KeyError))
    assert not failure_contains(nested, TimeoutError)
    deep = chain(*[RuntimeError(str(i)) for i in range(failures._MAX_CAUSE_DEPTH + 1)], GymTransportError())
    assert not failure_contains(deep, GymTransportError)
    assert not failure_contains(Hostile(), ValueError)


# --- diagnosis: every per-attempt verdict from one walk ------------------------------------------------------------


def test_diagnosis_of_an_upstream_5xx_blames_the_shard_and_names_the_cause() -> None:
    failure = chain(RuntimeError("turn 3 failed"), response_error(503, "Service Unavailable"))
    assert diagnose(failure) == Diagnosis(
        failure_class=INFRA,
        failure_type="RuntimeError",
        blames_shard=True,
        terminal=False,
        reason="RuntimeError: turn 3 failed <- ClientResponseError: HTTP 503: Service Unavailable",
        status=503,
    )


@pytest.mark.parametrize(
    "exc",
    [
        ExceptionGroup("episode", [GymTransportError("environment server reset the connection")]),
        chain(RuntimeError("wrap"), NoHealthyShards("no routable shard within 30s")),
    ],
    ids=["environment-side", "no-shard"],
)
def test_infra_failures_elsewhere_do_not_blame_the_generation_shard(exc: BaseException) -> None:
    diagnosis = diagnose(exc)
    assert diagnosis.failure_class is INFRA
    assert not diagnosis.blames_shard


def test_a_terminal_data_failure_in_a_group_is_terminal_data_and_blames_nobody() -> None:
    diagnosis = diagnose(chain(RuntimeError("episode"), ExceptionGroup("g", [RolloutTerminalDataFailure("no")])))
    assert (diagnosis.failure_class, diagnosis.terminal, diagnosis.blames_shard) == (DATA, True, False)


def test_diagnosis_reports_the_original_type_and_a_redacted_bounded_reason() -> None:
    converted = RolloutDataFailure("x" * 5000 + " api_key=hunter22", original_type="openai.BadRequestError")
    diagnosis = diagnose(converted)
    assert diagnosis.failure_type == "BadRequestError"
    assert len(diagnosis.reason) == failures.MAX_MESSAGE_CHARS
    leaked = diagnose(GenerationUnavailable("refused Authorization: Bearer abcdefghijkl"))
    assert "abcdefghijkl" not in leaked.reason


def test_a_cause_that_is_also_a_group_member_is_judged_once_and_still_named() -> None:
    """The group walk has met ``member`` already, so the chain's second sight of it cannot make the group INFRA;
    the description still names every cause in the chain."""
    member = TimeoutError("slow")
    group = ExceptionGroup("g", [member, KeyError("bug")])
    group.__cause__ = member
    diagnosis = diagnose(group)
    assert diagnosis.failure_class is DATA
    assert diagnosis.reason == "ExceptionGroup: g (2 sub-exceptions) <- TimeoutError: slow"


@given(exceptions())
def test_diagnosis_agrees_with_the_single_purpose_helpers(exc: BaseException) -> None:
    """``diagnose`` and the public helpers are views of one walk: for any exception graph they give one answer."""
    diagnosis = diagnose(exc)
    assert diagnosis.failure_class is classify_rollout_failure(exc)
    assert diagnosis.failure_type == failure_type(exc)
    assert diagnosis.terminal is failure_contains(exc, RolloutTerminalDataFailure)
    elsewhere = failure_contains(exc, (GymTransportError, NoHealthyShards))
    assert diagnosis.blames_shard is (diagnosis.failure_class is INFRA and not elsewhere)
    assert diagnosis.reason == safe_message(describe_failure(exc))
