"""The three custom resources as pydantic models: the one source of their schema, defaults and field names.

Group ``rolloutfleet.dev``, version ``v1alpha1``. Python names are snake_case, Kubernetes names camelCase (aliases);
both validate. The CRDs in ``crds/`` are generated from these classes by :mod:`fleet_operator.crds`, so a field's
type, bounds, default and description live here exactly once. Cross-field rules are written twice on purpose: as
a CEL rule in ``json_schema_extra`` (the API server rejects a bad object with that message) and as a pydantic
validator (the operator and the runtime never act on an object that slipped past an older CRD); a unit test
checks that both layers reject the same specs.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from rollout_runtime.health import HealthPhase, ProbeSettings
from rollout_runtime.kube.kinds import API_VERSION, GROUP, VERSION

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "Condition",
    "ConditionStatus",
    "DispatchPolicySpec",
    "EnvironmentServerEntry",
    "EnvironmentServerSpec",
    "EnvironmentServerStatus",
    "GenerationShardSpec",
    "GenerationShardStatus",
    "HealthySetEntry",
    "LabelSelector",
    "LabelSelectorRequirement",
    "ProbeSpec",
    "RolloutFleetSpec",
    "RolloutFleetStatus",
    "ServiceRef",
    "ShardStatus",
    "StallAction",
]

_DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_PROBE_PATH = r"^/[^?#\\\s]*$"

_MAP_LIST_BY_TYPE: Final[dict[str, Any]] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
_MAP_LIST_BY_NAME: Final[dict[str, Any]] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}


def _cel(rule: str, message: str, **extra: str) -> dict[str, Any]:
    return {"rule": rule, "message": message, **extra}


class _KubeModel(BaseModel):
    """camelCase on the wire, snake_case in Python; attribute docstrings become schema descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
        extra="ignore",
        frozen=True,
    )

    def to_kube(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, unset optionals omitted."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------------------------------------------------------
# Shared parts


class ServiceRef(_KubeModel):
    """An in-cluster Service in the resource's own namespace; probed at ``<scheme>://<name>.<ns>.svc.<domain>:<port>``."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL)]
    """Name of the Service (same namespace as this resource; cross-namespace references are not allowed)."""
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    """Service port number."""
    scheme: Literal["http", "https"] = "http"
    """URL scheme used for probes and traffic."""


class ProbeSpec(_KubeModel, ProbeSettings):
    """Active health probe: GET ``path`` (and, for generation shards with a model, ``/v1/models``) every period."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.timeoutSeconds < self.periodSeconds",
                    "probe.timeoutSeconds must be less than probe.periodSeconds, or probes of one target overlap;"
                    " lower timeoutSeconds or raise periodSeconds",
                    fieldPath=".timeoutSeconds",
                ),
                _cel(
                    "!self.path.startsWith('//')",
                    "probe.path must be a path on the target like /health, not a host (it starts with //)",
                    fieldPath=".path",
                ),
            ]
        },
    )

    path: Annotated[str, Field(min_length=1, max_length=1024, pattern=_PROBE_PATH)] = "/health"
    """Health endpoint path relative to the base URL (no query, no fragment)."""
    period_seconds: Annotated[float, Field(ge=0.05, le=3600)] = 5.0
    """Seconds between probe starts."""
    timeout_seconds: Annotated[float, Field(ge=0.01, le=3600)] = 2.0
    """Deadline for one whole probe; must be less than periodSeconds."""
    failure_threshold: Annotated[int, Field(ge=1, le=1000)] = 3
    """Consecutive failed probes that take a target out of the healthy set."""
    success_threshold: Annotated[int, Field(ge=1, le=1000)] = 2
    """Consecutive successful probes that bring a target (back) into the healthy set."""


_ENDPOINT_RULES: Final[list[Any]] = [
    _cel(
        "has(self.serviceRef) != has(self.endpoint)",
        "set exactly one of spec.serviceRef (an in-cluster Service) or spec.endpoint (an explicit http(s) URL)",
    ),
]


class _TargetSpec(_KubeModel):
    """Where a probed target is, how it is probed, and whether it takes traffic."""

    service_ref: ServiceRef | None = None
    """The in-cluster Service that fronts this target. Exactly one of serviceRef or endpoint."""
    endpoint: (
        Annotated[
            str,
            Field(
                min_length=8,
                max_length=2048,
                pattern=r"^https?://[^/?#\s]+(/[^?#\s]*)?$",
                json_schema_extra={
                    "x-kubernetes-validations": [
                        _cel(
                            "isURL(self) && url(self).getHostname() != ''",
                            "endpoint must be an absolute http(s) URL with a host, like http://10.0.0.7:8000",
                        ),
                        _cel(
                            "!self.matches('^https?://[^/]*@')",
                            "endpoint must not carry credentials (user:password@): it is shown in status and Events,"
                            " and probes never send them",
                        ),
                    ]
                },
            ),
        ]
        | None
    ) = None
    """Explicit base URL (http or https, no query). The operator probes it only if its host is on the allowlist."""
    weight: Annotated[float, Field(gt=0, le=1_000_000)] = 1.0
    """Relative share of traffic."""
    drain: bool = False
    """Take no new traffic (the target leaves the healthy set at once); probes keep running."""
    # The full default (not {}): the API server checks a default against the CEL rules without nested defaulting.
    probe: ProbeSpec = Field(default_factory=ProbeSpec, json_schema_extra={"default": ProbeSpec().to_kube()})
    """Active health probe settings."""

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if "@" in parts.netloc:  # checked first, and the value is not echoed: it holds a credential
            raise ValueError("endpoint must not carry credentials (user:password@): it is shown in status and Events")
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"endpoint must be an absolute http(s) URL with a host and no query, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _one_location(self) -> _TargetSpec:
        if (self.service_ref is None) == (self.endpoint is None):
            raise ValueError(_ENDPOINT_RULES[0]["message"])
        return self


class Condition(_KubeModel):
    """metav1.Condition: lastTransitionTime changes only when status flips."""

    type: Annotated[str, Field(min_length=1, max_length=316)]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=_CONDITION_REASON)]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    observed_generation: Annotated[int, Field(ge=0)] | None = None


ConditionStatus = Literal["True", "False", "Unknown"]


class ShardStatus(_KubeModel):
    """What the operator observed of one probed target (written on transitions and a coalesced heartbeat)."""

    phase: HealthPhase = HealthPhase.PENDING
    """Pending, Healthy, Suspect (serving, recent failures), Unhealthy, or Draining."""
    endpoint: Annotated[str, Field(max_length=2048)] | None = None
    """The base URL the operator probes (resolved from serviceRef or spec.endpoint)."""
    consecutive_successes: Annotated[int, Field(ge=0)] = 0
    consecutive_failures: Annotated[int, Field(ge=0)] = 0
    last_error: Annotated[str, Field(max_length=1024)] | None = None
    """The latest failed probe's reason and message (kept after recovery)."""
    latency_milliseconds: Annotated[float, Field(ge=0)] | None = None
    """Latency of the latest probe (as of the last status write)."""
    last_probe_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None
    """When the latest probe finished (as of the last status write)."""
    last_success_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None
    """When the latest successful probe finished (as of the last status write)."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    conditions: Annotated[list[Condition], Field(max_length=8)] = Field(
        default_factory=list, json_schema_extra=_MAP_LIST_BY_TYPE
    )
    """Ready: True while the target is in the healthy set (Healthy or Suspect, not draining)."""


class GenerationShardStatus(ShardStatus):
    """Status of a GenerationShard."""


class EnvironmentServerStatus(ShardStatus):
    """Status of an EnvironmentServer."""


# ---------------------------------------------------------------------------------------------------------------
# GenerationShard


class GenerationShardSpec(_TargetSpec):
    """An OpenAI-compatible generation server (vLLM-style) that rollouts may be dispatched to."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _ENDPOINT_RULES})

    model: Annotated[str, Field(max_length=512)] = ""
    """The model the shard must serve; when set, probes also require /v1/models to list it. Empty: any."""
    max_model_len: Annotated[int, Field(ge=1, le=100_000_000)] | None = None
    """The shard's context length (prompt plus completion tokens), for the runtime's data-failure checks."""


# ---------------------------------------------------------------------------------------------------------------
# EnvironmentServer


class EnvironmentServerSpec(_TargetSpec):
    """An environment server (episode protocol: tools, verifiers, user simulators)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _ENDPOINT_RULES})

    protocol: Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL)] = "episode-v1"
    """Name of the episode protocol the server speaks."""
    episode_timeout_seconds: Annotated[float, Field(gt=0, le=86_400)] | None = None
    """Per-episode deadline the server enforces; unset means no bound."""
    max_concurrent_episodes: Annotated[int, Field(ge=1, le=1_000_000)] = 64
    """Episodes the server runs at once (more wait in its admission queue)."""


# ---------------------------------------------------------------------------------------------------------------
# RolloutFleet


class LabelSelectorRequirement(_KubeModel):
    """metav1.LabelSelectorRequirement."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0)"
                    " : (!has(self.values) || size(self.values) == 0)",
                    "matchExpressions: operators In and NotIn need at least one value;"
                    " Exists and DoesNotExist take no values",
                ),
            ]
        }
    )

    key: Annotated[str, Field(min_length=1, max_length=317)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=64)] = Field(default_factory=list)
    """Label values; required for In and NotIn, forbidden for Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _values_match_operator(self) -> LabelSelectorRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise ValueError(
                "matchExpressions: operators In and NotIn need at least one value; Exists and DoesNotExist take none"
            )
        return self


class LabelSelector(_KubeModel):
    """metav1.LabelSelector (same namespace as the fleet). An empty selector selects every object of the kind."""

    match_labels: Annotated[dict[str, Annotated[str, Field(max_length=63)]], Field(max_length=64)] = Field(
        default_factory=dict
    )
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] = Field(default_factory=list)


class StallAction(str, enum.Enum):
    """What the runtime's stall watchdog does when nothing commits within the deadline."""

    WARN = "warn"
    ABORT = "abort"


class DispatchPolicySpec(_KubeModel):
    """The retry and stall policy the trainer-side runtime applies to this fleet (read by KubernetesShardSource).

    Field names and defaults are DispatchPolicy's (camelCase), except that attemptTimeoutSeconds defaults to 300 s.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.stallDeadlineSeconds > self.attemptTimeoutSeconds",
                    "policy.stallDeadlineSeconds must be greater than policy.attemptTimeoutSeconds, or the watchdog"
                    " fires while a healthy attempt is still within its deadline",
                    fieldPath=".stallDeadlineSeconds",
                ),
                _cel(
                    "self.stallCheckSeconds <= self.stallDeadlineSeconds",
                    "policy.stallCheckSeconds must not exceed policy.stallDeadlineSeconds, or a stall can go unseen",
                    fieldPath=".stallCheckSeconds",
                ),
                _cel(
                    "self.backoffMaxSeconds >= self.backoffInitialSeconds",
                    "policy.backoffMaxSeconds must be at least policy.backoffInitialSeconds",
                    fieldPath=".backoffMaxSeconds",
                ),
                _cel(
                    "self.ejectionMaxSeconds >= self.ejectionBaseSeconds",
                    "policy.ejectionMaxSeconds must be at least policy.ejectionBaseSeconds",
                    fieldPath=".ejectionMaxSeconds",
                ),
            ]
        }
    )

    max_infra_attempts: Annotated[int, Field(ge=1, le=1000)] = 5
    """Attempts per prompt that may fail for infrastructure reasons before the run gives up."""
    max_data_attempts: Annotated[int, Field(ge=1, le=100)] = 2
    """Attempts per prompt that may fail for data reasons before the prompt is reported data-failed."""
    backoff_initial_seconds: Annotated[float, Field(ge=0, le=3600)] = 1.0
    """First backoff between infra attempts; multiplied by backoffMultiplier up to backoffMaxSeconds."""
    backoff_max_seconds: Annotated[float, Field(ge=0, le=3600)] = 30.0
    backoff_multiplier: Annotated[float, Field(ge=1, le=100)] = 2.0
    backoff_jitter: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Fraction of each backoff randomised downwards."""
    attempt_timeout_seconds: Annotated[float, Field(gt=0, le=86_400)] = 300.0
    """Deadline for one rollout attempt (exceeding it is an infra failure)."""
    max_concurrency: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    """Attempts in flight at once across the fleet; unset: every prompt of a run at once."""
    max_skipped_prompts: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    """Prompts that may exhaust their infra budget and be skipped before the run fails."""
    healthy_wait_seconds: Annotated[float, Field(ge=0, le=86_400)] = 30.0
    """How long an attempt waits for an eligible shard before failing with NoHealthyShards."""
    ejection_base_seconds: Annotated[float, Field(gt=0, le=86_400)] = 30.0
    """Passive ejection after an infra failure lasts this long at first, doubling on repeats."""
    ejection_max_seconds: Annotated[float, Field(gt=0, le=86_400)] = 300.0
    max_ejection_percent: Annotated[float, Field(ge=0, le=100)] = 50.0
    """Share of the healthy set that may be ejected at once."""
    stall_deadline_seconds: Annotated[float, Field(gt=0, le=604_800)] = 600.0
    """Rollouts in flight but none committed for this long is a stall."""
    stall_check_seconds: Annotated[float, Field(gt=0, le=86_400)] = 30.0
    """How often the stall watchdog looks."""
    stall_action: StallAction = StallAction.WARN
    """warn: log and count; abort: raise RolloutStall in the trainer."""

    @model_validator(mode="after")
    def _consistent(self) -> DispatchPolicySpec:
        if self.stall_deadline_seconds <= self.attempt_timeout_seconds:
            raise ValueError("policy.stallDeadlineSeconds must be greater than policy.attemptTimeoutSeconds")
        if self.stall_check_seconds > self.stall_deadline_seconds:
            raise ValueError("policy.stallCheckSeconds must not exceed policy.stallDeadlineSeconds")
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError("policy.backoffMaxSeconds must be at least policy.backoffInitialSeconds")
        if self.ejection_max_seconds < self.ejection_base_seconds:
            raise ValueError("policy.ejectionMaxSeconds must be at least policy.ejectionBaseSeconds")
        return self


class RolloutFleetSpec(_KubeModel):
    """Which shards and environment servers form the fleet, and the policy the runtime applies to it."""

    shard_selector: LabelSelector
    """Selects GenerationShards in the fleet's namespace."""
    environment_server_selector: LabelSelector | None = None
    """Selects EnvironmentServers in the fleet's namespace; unset: the fleet has none."""
    min_ready_shards: Annotated[int, Field(ge=0, le=100_000)] = 1
    """The fleet is Ready while at least this many shards are in the healthy set."""
    policy: DispatchPolicySpec = Field(
        default_factory=DispatchPolicySpec, json_schema_extra={"default": DispatchPolicySpec().to_kube()}
    )


class HealthySetEntry(_KubeModel):
    """One generation shard in the fleet's healthy set (the fields the runtime's Shard needs)."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    endpoint: Annotated[str, Field(max_length=2048)]
    model: Annotated[str, Field(max_length=512)] = ""
    max_model_len: Annotated[int, Field(ge=1)] | None = None
    weight: Annotated[float, Field(gt=0)] = 1.0
    last_success_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None
    """Latest successful probe (heartbeat granularity): the runtime un-ejects a shard a probe vouched for since."""


class EnvironmentServerEntry(_KubeModel):
    """One environment server eligible for episodes."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    endpoint: Annotated[str, Field(max_length=2048)]
    protocol: Annotated[str, Field(max_length=63)] = ""
    max_concurrent_episodes: Annotated[int, Field(ge=1)] | None = None
    episode_timeout_seconds: Annotated[float, Field(gt=0)] | None = None
    weight: Annotated[float, Field(gt=0)] = 1.0


class RolloutFleetStatus(_KubeModel):
    """The healthy set the runtime follows, with counts and conditions. Written coalesced, only when it changes."""

    revision: Annotated[str, Field(max_length=64)] = ""
    """Digest of the healthy set: changes whenever the set (shards or environment servers) changes."""
    healthy: Annotated[str, Field(max_length=32)] = "0/0"
    """readyShards/totalShards, for kubectl."""
    ready_shards: Annotated[int, Field(ge=0)] = 0
    total_shards: Annotated[int, Field(ge=0)] = 0
    ready_environment_servers: Annotated[int, Field(ge=0)] = 0
    total_environment_servers: Annotated[int, Field(ge=0)] = 0
    shards: Annotated[list[HealthySetEntry], Field(max_length=10_000)] = Field(
        default_factory=list, json_schema_extra=_MAP_LIST_BY_NAME
    )
    """The healthy set: generation shards eligible for traffic, sorted by name."""
    environment_servers: Annotated[list[EnvironmentServerEntry], Field(max_length=10_000)] = Field(
        default_factory=list, json_schema_extra=_MAP_LIST_BY_NAME
    )
    """Environment servers eligible for episodes, sorted by name."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    last_heartbeat_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None
    """Refreshed on a coalesced heartbeat: a stale value means no operator is reconciling this fleet."""
    conditions: Annotated[list[Condition], Field(max_length=8)] = Field(
        default_factory=list, json_schema_extra=_MAP_LIST_BY_TYPE
    )
    """Ready (at least minReadyShards healthy) and Degraded (some selected member is not healthy)."""
