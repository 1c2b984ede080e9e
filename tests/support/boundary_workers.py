"""Functions run in another process (multiprocessing or a Ray actor) by the boundary tests.

Each raises the failure a real shard client meets; ``converted_*`` do it behind ``@picklable_failures``.
"""

from __future__ import annotations

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from rollout_runtime.failures import FailureClass, classify_rollout_failure, picklable_failures

VLLM_CONTEXT_LENGTH = (
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
    "(4900 in the messages, 100 in the completion). Please reduce the length of the messages or completion."
)


def make_failure(kind: str) -> BaseException:
    headers = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json", "Retry-After": "1"}))
    url = URL("http://127.0.0.1:8000/v1/completions")
    request = aiohttp.RequestInfo(url, "POST", headers, url)
    if kind == "overloaded":  # vLLM's 503 carries headers that do not pickle
        return aiohttp.ClientResponseError(request, (), status=503, message="Service Unavailable", headers=headers)
    if kind == "context_length":
        return aiohttp.ClientResponseError(request, (), status=400, message=VLLM_CONTEXT_LENGTH, headers=headers)
    if kind == "wrapped_reset":  # pickling drops __cause__, and with it the reason this is infra
        outer = RuntimeError("generation request failed")
        outer.__cause__ = ConnectionResetError(104, "Connection reset by peer")
        return outer
    raise ValueError(f"unknown failure kind {kind!r}")


def truth(kind: str) -> FailureClass:
    """How the failure classifies where it was raised, with all its information."""
    return classify_rollout_failure(make_failure(kind))


def raw_failure(kind: str) -> None:
    raise make_failure(kind)


@picklable_failures
def converted_failure(kind: str) -> None:
    raise make_failure(kind)
