"""The router's settings, one validated object: the one place each is named, bounded, defaulted and described.

``rollout-fleet router``'s options are generated from :data:`ROUTER_SETTINGS` (:mod:`rollout_runtime.cli.router`);
the chart's ``router.*`` values, their schema and the Deployment's arguments spell them again, and
``tests/unit/test_router_settings.py`` checks every spelling against this model (name, default, bounds,
description). A router that follows a RolloutFleet takes the fleet's ``spec.policy`` as :attr:`RouterConfig.policy`,
under its own settings (:meth:`RouterConfig.dispatch_policy`).
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollout_runtime.dispatch.policy import DispatchPolicy

__all__ = ["DEFAULT_AFFINITY_HEADER", "REQUEST_POLICY", "ROUTER_SETTINGS", "RouterConfig"]

DEFAULT_AFFINITY_HEADER = "X-Session-ID"
"""The request header naming a session; without it, the OpenAI ``user`` field of the body is the session."""

REQUEST_POLICY: Final[dict[str, Any]] = {
    "max_data_attempts": 1,
    "backoff_initial_seconds": 0.02,
    "backoff_max_seconds": 0.5,
    "stall_action": "warn",
}
"""Policy fields a router sets whatever its fleet's policy says, because its unit of work is one client's request,
not a training step: a shard's 4xx is relayed at once (the client decides, so one data attempt); a redispatch waits
tens of milliseconds, not seconds, because a client is waiting on the connection; and a stall only warns, because
ending the session would fail every request in flight, whose own budgets already bound them."""


class RouterConfig(BaseModel):
    """Limits and timeouts of ``rollout-fleet router``; the dispatch policy is :meth:`dispatch_policy`."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_body_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 8 * 1024 * 1024
    """A request body larger than this is refused with 413 before any shard sees it."""
    max_response_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 64 * 1024 * 1024
    """A non-streamed shard reply larger than this is a failure of that shard (a stream is relayed, not held)."""
    max_concurrency: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    """Requests in flight at once in one router (per replica); the next one is refused with 429 and Retry-After."""
    retry_after_seconds: Annotated[int, Field(ge=1, le=3600)] = 1
    """The Retry-After of a 429, in seconds."""
    connect_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 5.0
    """Connecting to a shard, in seconds; past it the attempt fails (infra) and goes elsewhere."""
    read_timeout_seconds: Annotated[float, Field(gt=0, le=86_400)] = 120.0
    """Longest silence from a shard, in seconds: before its reply's first byte (then the request is retried
    elsewhere) or between two bytes of a stream (then the stream ends with an error event)."""
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 3
    """Shards one request may try (infra failures) before the router answers 502."""
    healthy_wait_seconds: Annotated[float, Field(ge=0, le=600)] = 2.0
    """How long a retry waits for a routable shard before the request fails, in seconds."""
    max_ejection_percent: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 100.0
    """Share of the healthy shards passive ejection may take out at once. 100, not the dispatcher's 50: a router's
    client sends each request once, so a request that runs out of attempts on shards known to be failing is lost;
    with every shard ejected the dispatcher still routes to all of them (panic mode), never to none."""
    affinity_header: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9-]+$")] = (
        DEFAULT_AFFINITY_HEADER
    )
    """Request header that names a session (affinity); the body's user field is the fallback."""

    policy: DispatchPolicy = Field(default_factory=DispatchPolicy, exclude=True)
    """The dispatch policy the settings above refine: the followed RolloutFleet's ``spec.policy``
    (``router --fleet``), else DispatchPolicy's defaults. Not a setting: no option or chart value sets it."""

    @model_validator(mode="after")
    def _policy_holds(self) -> RouterConfig:
        self.dispatch_policy()  # the fleet's policy under the router's fields must still meet the policy's rules
        return self

    def following(self, policy: DispatchPolicy) -> RouterConfig:
        """These settings over ``policy`` (a RolloutFleet's, from ``KubernetesShardSource.dispatch_policy``)."""
        return type(self)(**{name: getattr(self, name) for name in ROUTER_SETTINGS}, policy=policy)

    def dispatch_policy(self) -> DispatchPolicy:
        """The dispatcher's policy: :attr:`policy` (the fleet's attempt timeout, ejection times, progress watchdog,
        hedging, weights lag...), with the router's own settings (attempts, healthy wait, ejection share) and
        :data:`REQUEST_POLICY` on top. An exhausted request is an answer (skipped), not the end of the router."""
        return DispatchPolicy(
            **{
                **self.policy.model_dump(),
                **REQUEST_POLICY,
                "max_infra_attempts": self.max_attempts,
                "healthy_wait_seconds": self.healthy_wait_seconds,
                "max_ejection_percent": self.max_ejection_percent,
            }
        )


ROUTER_SETTINGS: Final[tuple[str, ...]] = tuple(name for name in RouterConfig.model_fields if name != "policy")
"""The router's settings (snake_case): each is a ``rollout-fleet router`` option and a chart ``router.*`` value."""
