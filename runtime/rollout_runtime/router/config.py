"""The router's settings, one validated object (the CLI's flags and the chart's values map onto it)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from rollout_runtime.dispatch.policy import DispatchPolicy

__all__ = ["DEFAULT_AFFINITY_HEADER", "RouterConfig"]

DEFAULT_AFFINITY_HEADER = "X-Session-ID"
"""The request header naming a session; without it, the OpenAI ``user`` field of the body is the session."""


class RouterConfig(BaseModel):
    """Limits and timeouts of ``rollout-fleet router``; the dispatch policy is :meth:`dispatch_policy`."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_body_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 8 * 1024 * 1024
    """A request body larger than this is refused with 413 before any shard sees it."""
    max_response_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 64 * 1024 * 1024
    """A non-streamed shard reply larger than this is a failure of that shard (a stream is relayed, not held)."""
    max_concurrency: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    """Requests in flight at once; the next one is refused with 429 and ``Retry-After``."""
    retry_after_seconds: Annotated[int, Field(ge=1, le=3600)] = 1
    """The ``Retry-After`` of a 429."""
    connect_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 5.0
    """Connecting to a shard; past it the attempt fails (infra) and goes elsewhere."""
    read_timeout_seconds: Annotated[float, Field(gt=0, le=86_400)] = 120.0
    """Longest silence from a shard: before its reply's first byte (then the request is retried elsewhere) or
    between two bytes of a stream (then the stream ends with an error event)."""
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 3
    """Shards one request may try (infra failures) before the router answers 502."""
    healthy_wait_seconds: Annotated[float, Field(ge=0, le=600)] = 2.0
    """How long a retry waits for a routable shard before the request fails."""
    max_ejection_percent: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 100.0
    """Share of the healthy shards passive ejection may take out at once. 100, not the dispatcher's 50: a router's
    client sends each request once, so a request that runs out of attempts on shards known to be failing is lost;
    with every shard ejected the dispatcher still routes to all of them (panic mode), never to none."""
    affinity_header: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9-]+$")] = (
        DEFAULT_AFFINITY_HEADER
    )
    """Request header that names a session (affinity); the body's ``user`` field is the fallback."""

    def dispatch_policy(self) -> DispatchPolicy:
        """The dispatcher's policy for one request: a shard's 4xx is relayed at once (one data attempt), an
        exhausted request is an answer (skipped), not the end of the router."""
        return DispatchPolicy(
            max_infra_attempts=self.max_attempts,
            max_data_attempts=1,
            backoff_initial_seconds=0.02,
            backoff_max_seconds=0.5,
            healthy_wait_seconds=self.healthy_wait_seconds,
            max_ejection_percent=self.max_ejection_percent,
        )
