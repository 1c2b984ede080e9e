"""Failures cross a real process boundary classified, or the driver guesses wrong.

Without conversion, pickling drops the cause and chokes on aiohttp's headers, and the driver calls an
overloaded shard a bad prompt. With ``@picklable_failures`` the driver classifies exactly as the worker would.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest

from rollout_runtime.failures import FailureClass, RolloutFailure, classify_rollout_failure
from support.boundary_workers import converted_failure, raw_failure, truth

INFRA_KINDS = ["overloaded", "wrapped_reset"]
ALL_KINDS = [*INFRA_KINDS, "context_length"]


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as executor:
        yield executor


def failure_from(pool: ProcessPoolExecutor, func: object, kind: str) -> BaseException:
    future = pool.submit(func, kind)  # type: ignore[arg-type]
    exc = future.exception(timeout=120)
    assert exc is not None, "the worker was expected to fail"
    return exc


@pytest.mark.parametrize("kind", INFRA_KINDS)
def test_without_conversion_the_driver_misclassifies_infra(pool: ProcessPoolExecutor, kind: str) -> None:
    assert truth(kind) is FailureClass.INFRA
    arrived = failure_from(pool, raw_failure, kind)
    assert classify_rollout_failure(arrived) is FailureClass.DATA, f"{kind} arrived as {arrived!r}"


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_with_conversion_the_driver_classifies_like_the_worker(pool: ProcessPoolExecutor, kind: str) -> None:
    arrived = failure_from(pool, converted_failure, kind)
    assert isinstance(arrived, RolloutFailure)
    assert classify_rollout_failure(arrived) is truth(kind)
    assert arrived.original_type is not None
    if kind != "wrapped_reset":
        assert arrived.status in (400, 503)


def test_context_length_reason_survives_the_crossing(pool: ProcessPoolExecutor) -> None:
    arrived = failure_from(pool, converted_failure, "context_length")
    assert "maximum context length is 4096 tokens" in str(arrived)


# --- a real Ray actor ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_actor() -> Iterator[object]:
    """A real Ray actor in a local cluster on 127.0.0.1; the pytest process gets its signal handler back after."""
    import ray  # the `ray` extra is part of the test environment; imported here because it is slow to import

    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init installs its own and shutdown does not restore it
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(
            num_cpus=1,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
        )
        try:

            @ray.remote(num_cpus=0)
            class Worker:
                def raw(self, kind: str) -> None:
                    raw_failure(kind)

                def converted(self, kind: str) -> None:
                    converted_failure(kind)

            yield ray, Worker.remote()
        finally:
            ray.shutdown()
            signal.signal(signal.SIGTERM, sigterm)


def ray_failure(ray_actor: object, method: str, kind: str) -> BaseException:
    ray, actor = ray_actor  # type: ignore[misc]
    with pytest.raises(BaseException) as info:
        ray.get(getattr(actor, method).remote(kind), timeout=120)
    return info.value


@pytest.mark.parametrize("kind", INFRA_KINDS)
def test_ray_actor_without_conversion_misclassifies_infra(ray_actor: object, kind: str) -> None:
    arrived = ray_failure(ray_actor, "raw", kind)
    assert classify_rollout_failure(arrived) is FailureClass.DATA, f"{kind} arrived as {type(arrived)}"


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_ray_actor_with_conversion_classifies_like_the_actor(ray_actor: object, kind: str) -> None:
    arrived = ray_failure(ray_actor, "converted", kind)
    assert isinstance(arrived, RolloutFailure)  # Ray's RayTaskError subclasses the raised type
    assert classify_rollout_failure(arrived) is truth(kind)
