"""The four custom resources as pydantic models: the one source of their schema, defaults and field names.

Group ``rolloutfleet.dev``, version ``v1alpha1``: the types both sides of the contract use, as
gateway-api-inference-extension shares its ``api/v1`` types between its controller and its endpoint picker. The
operator validates specs and writes statuses with them, and generates the CRDs in ``crds/`` from them
(:mod:`fleet_operator.crds`); the runtime reads a RolloutFleet's status with them
(:func:`read_fleet_status`: the healthy set, environment servers and shard weights). So a field's name, type,
bounds, default and description live here exactly once, below the operator: the runtime never imports it.

Python names are snake_case, Kubernetes names camelCase (aliases); both validate. The probe (``ProbeSpec``) and the
fleet's policy (``DispatchPolicySpec``) are not declared here at all: they are derived from the runtime's
``ProbeSettings`` and ``DispatchPolicy`` and that model's :class:`~rollout_runtime.schema.ClusterView` (what
differs in a cluster, stated once beside the runtime model). A cross-field rule is a CEL rule in
``json_schema_extra`` (the API server rejects a bad object with that message) and a pydantic validator (the
operator and the runtime never act on an object that slipped past an older CRD); for the derived models both come
from one rules list, for the rest a unit test checks that both layers reject the same specs.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from rollout_runtime.dispatch.policy import FLEET_POLICY, DispatchPolicy
from rollout_runtime.health.hysteresis import PROBE_IN_CLUSTER, HealthPhase, ProbeSettings
from rollout_runtime.kube.kinds import API_VERSION, GROUP, VERSION
from rollout_runtime.schema import ClusterView, rules_validator

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "Condition",
    "ConditionStatus",
    "DispatchPolicySpec",
    "EnvironmentServerEntry",
    "EnvironmentServerPods",
    "EnvironmentServerSpec",
    "EnvironmentServerStatus",
    "GenerationShardSpec",
    "GenerationShardStatus",
    "HealthySetEntry",
    "LabelSelector",
    "LabelSelectorRequirement",
    "PodSelection",
    "PolicyVersionSpec",
    "PortRef",
    "ProbeSpec",
    "RefitPhase",
    "RefitRecord",
    "RolloutFleetSpec",
    "RolloutFleetStatus",
    "ServiceRef",
    "ShardPods",
    "ShardStatus",
    "ShardWeights",
    "read_fleet_status",
]

log = logging.getLogger(__name__)

_DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

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


def _non_null(annotation: Any) -> Any:
    """``X | None`` -> ``X``."""
    if get_origin(annotation) in (Union, types.UnionType):
        (member,) = (arg for arg in get_args(annotation) if arg is not type(None))
        return member
    return annotation


def _field_in_cluster(name: str, info: FieldInfo, view: ClusterView) -> tuple[Any, FieldInfo]:
    """A runtime field as the view says it is in a cluster: same type, bounds, default and description otherwise."""
    annotation, metadata, default = info.annotation, list(info.metadata), info.default
    if name in view.defaults:
        annotation, default = _non_null(annotation), view.defaults[name]
    if name in view.minimum:
        metadata = [m for m in metadata if not isinstance(m, annotated_types.Gt | annotated_types.Ge)]
        metadata.append(annotated_types.Ge(view.minimum[name]))
    schema = dict(view.schema.get(name, {}))
    extra: dict[str, Any] | Callable[[dict[str, Any]], None] | None
    extra = _without_schema_default(schema) if name in view.derived else (schema or None)
    if info.default_factory is not None and name not in view.defaults:
        field = Field(default_factory=info.default_factory, description=info.description, json_schema_extra=extra)
    else:
        field = Field(default=default, description=info.description, json_schema_extra=extra)
    return (Annotated[annotation, *metadata] if metadata else annotation), field


def _without_schema_default(extra: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """A ``json_schema_extra`` that adds ``extra`` and drops the default: the field keeps its Python default, but
    the CRD has none, so the API server leaves it unset and the model derives it from the other fields."""

    def update(schema: dict[str, Any]) -> None:
        schema.pop("default", None)
        schema.update(extra)

    return update


def _in_cluster(source: type[BaseModel], view: ClusterView, *, subclass: bool = False) -> type[_KubeModel]:
    """The CRD model of runtime model ``source``: its fields as ``view`` says they are in a cluster, camelCase, and the
    view's rules both as CEL (``x-kubernetes-validations``) and as a validator with the CEL messages (pydantic's
    error location names the parent field, so the messages drop the ``scope.`` prefix).

    ``subclass``: the result is also a ``source`` (a ProbeSpec is the ProbeSettings HealthState takes) and re-declares
    only the fields the view changes; otherwise it copies every field but the excluded ones.
    """
    if subclass and view.excluded:
        raise ValueError(f"a subclass of {source.__name__} cannot drop fields {sorted(view.excluded)}")
    names = [name for name in source.model_fields if name not in view.excluded]
    redeclared = [name for name in names if not subclass or name in view.changed()]
    optional = {name for name in names if source.model_fields[name].default is None and name not in view.defaults}
    optional |= view.derived
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": __name__, "__annotations__": annotations}
    for name in redeclared:
        annotations[name], namespace[name] = _field_in_cluster(name, source.model_fields[name], view)
    if view.rules:
        validations: list[Any] = [rule.cel(scope=view.scope, optional=optional) for rule in view.rules]
        namespace["model_config"] = ConfigDict(json_schema_extra={"x-kubernetes-validations": validations})
        namespace["_rules"] = rules_validator(view.rules, name=to_camel, show_values=False)
    bases = (_KubeModel, source) if subclass else (_KubeModel,)
    return type(f"_{source.__name__}InCluster", bases, namespace)


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


class ProbeSpec(_in_cluster(ProbeSettings, PROBE_IN_CLUSTER, subclass=True)):  # type: ignore[misc]
    """Active health probe: GET ``path`` (and, for generation shards with a model, ``/v1/models``) every period."""


_PROBE_DEFAULT: Final[dict[str, Any]] = PROBE_IN_CLUSTER.object_default(ProbeSpec().to_kube())
"""An omitted ``probe``'s default, without ``timeoutSeconds``: a later ``periodSeconds`` alone then derives it."""


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
    probe: ProbeSpec = Field(default_factory=ProbeSpec, json_schema_extra={"default": _PROBE_DEFAULT})
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
    """Pending, Healthy, Suspect (serving, recent failures), Unhealthy, Draining, Stale (restarted since its last
    refit: base weights, no traffic until refit) or Refitting (weights being updated, no traffic)."""
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
    instance: Annotated[str, Field(max_length=256)] | None = None
    """The observed instance identity (opaque: a pod's ``<uid>:<restarts>``, a weight version, a process start);
    a change after a refit makes the shard Stale."""
    weights_version: Annotated[int, Field(ge=0)] | None = None
    """The policy version of the last successful refit of this instance; unset when unknown (never refit,
    restarted since, or being refit)."""
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


class PortRef(_KubeModel):
    """A pod's port, InferencePool-style: by number, or by the name of a container port (resolved per pod)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("has(self.number) != has(self.name)", "targetPort: set exactly one of number or name")
            ]
        }
    )

    number: Annotated[int, Field(ge=1, le=65535)] | None = None
    """The port number the pods listen on."""
    name: Annotated[str, Field(min_length=1, max_length=15, pattern=_DNS_LABEL)] | None = None
    """The name of a container port (``ports[].name``); a pod without a port of that name is not a member."""

    @model_validator(mode="after")
    def _one_of(self) -> PortRef:
        if (self.number is None) == (self.name is None):
            raise ValueError("targetPort: set exactly one of number or name")
        return self


_POD_SOURCE_RULES: Final[list[Any]] = [
    _cel(
        "has(self.selector) != has(self.service)",
        "set exactly one of selector (pods by label) or service (the pods behind a Service, from its EndpointSlices)",
    ),
]


class PodSelection(_KubeModel):
    """Members discovered from pods in the fleet's namespace, one member per pod (for a LeaderWorkerSet, per group:
    only leader pods are members). The operator probes each pod's IP at ``targetPort``."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _POD_SOURCE_RULES})

    selector: LabelSelector | None = None
    """Pods whose labels match (fleet's namespace only). Exactly one of selector or service."""
    service: Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL)] | None = None
    """A Service in the fleet's namespace: its EndpointSlices' endpoints are the members."""
    target_port: PortRef
    """The port probes and traffic go to."""
    scheme: Literal["http", "https"] = "http"
    """URL scheme used for probes and traffic."""
    weight: Annotated[float, Field(gt=0, le=1_000_000)] = 1.0
    """Relative share of traffic of each member."""
    probe: ProbeSpec = Field(default_factory=ProbeSpec, json_schema_extra={"default": _PROBE_DEFAULT})
    """Active health probe settings, per member."""

    @model_validator(mode="after")
    def _one_source(self) -> PodSelection:
        if (self.selector is None) == (self.service is None):
            raise ValueError(_POD_SOURCE_RULES[0]["message"])
        return self


class ShardPods(PodSelection):
    """Generation shards discovered from pods."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _POD_SOURCE_RULES})

    model: Annotated[str, Field(max_length=512)] = ""
    """The model every member must serve; when set, probes also require /v1/models to list it. Empty: any."""
    max_model_len: Annotated[int, Field(ge=1, le=100_000_000)] | None = None
    """The members' context length (prompt plus completion tokens)."""


class EnvironmentServerPods(PodSelection):
    """Environment servers discovered from pods."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _POD_SOURCE_RULES})

    protocol: Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL)] = "episode-v1"
    """Name of the episode protocol the servers speak."""
    episode_timeout_seconds: Annotated[float, Field(gt=0, le=86_400)] | None = None
    """Per-episode deadline the servers enforce; unset means no bound."""
    max_concurrent_episodes: Annotated[int, Field(ge=1, le=1_000_000)] = 64
    """Episodes each server runs at once."""


class DispatchPolicySpec(_in_cluster(DispatchPolicy, FLEET_POLICY)):  # type: ignore[misc]
    """The retry and stall policy the trainer-side runtime applies to this fleet (read by KubernetesShardSource).

    Field names and defaults are DispatchPolicy's (camelCase), except that attemptTimeoutSeconds defaults to 300 s.
    """


class RolloutFleetSpec(_KubeModel):
    """Which shards and environment servers form the fleet, and the policy the runtime applies to it."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "has(self.shardSelector) || has(self.shardPods)",
                    "set spec.shardSelector (GenerationShard objects), spec.shardPods (pods), or both",
                )
            ]
        }
    )

    shard_selector: LabelSelector | None = None
    """Selects GenerationShards in the fleet's namespace (an empty selector selects all); unset: none."""
    shard_pods: ShardPods | None = None
    """Generation shards discovered from pods (by label, or behind a Service), one member per pod."""
    environment_server_selector: LabelSelector | None = None
    """Selects EnvironmentServers in the fleet's namespace; unset: the fleet has none."""
    environment_server_pods: EnvironmentServerPods | None = None
    """Environment servers discovered from pods, one member per pod."""
    min_ready_shards: Annotated[int, Field(ge=0, le=100_000)] = 1
    """The fleet is Ready while at least this many shards are in the healthy set."""
    policy: DispatchPolicySpec = Field(
        default_factory=DispatchPolicySpec, json_schema_extra={"default": DispatchPolicySpec().to_kube()}
    )

    @model_validator(mode="after")
    def _some_shards(self) -> RolloutFleetSpec:
        if self.shard_selector is None and self.shard_pods is None:
            raise ValueError("set spec.shardSelector (GenerationShard objects), spec.shardPods (pods), or both")
        return self


class HealthySetEntry(_KubeModel):
    """One generation shard in the fleet's healthy set (the fields the runtime's Shard needs)."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    endpoint: Annotated[str, Field(max_length=2048)]
    model: Annotated[str, Field(max_length=512)] = ""
    max_model_len: Annotated[int, Field(ge=1)] | None = None
    weight: Annotated[float, Field(gt=0)] = 1.0
    last_success_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None
    """Latest successful probe (heartbeat granularity): the runtime un-ejects a shard a probe vouched for since."""
    instance: Annotated[str, Field(max_length=128)] | None = Field(default=None, exclude_if=lambda v: v is None)
    """For a pod member: ``<pod uid>:<total container restarts>`` (for a LeaderWorkerSet, the leader's); it changes
    when the server behind the name restarts or is replaced. Absent for GenerationShard objects."""


class EnvironmentServerEntry(_KubeModel):
    """One environment server eligible for episodes."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    endpoint: Annotated[str, Field(max_length=2048)]
    protocol: Annotated[str, Field(max_length=63)] = ""
    max_concurrent_episodes: Annotated[int, Field(ge=1)] | None = None
    episode_timeout_seconds: Annotated[float, Field(gt=0)] | None = None
    weight: Annotated[float, Field(gt=0)] = 1.0
    instance: Annotated[str, Field(max_length=128)] | None = Field(default=None, exclude_if=lambda v: v is None)
    """For a pod member: ``<pod uid>:<total container restarts>``. Absent for EnvironmentServer objects."""


class ShardWeights(_KubeModel):
    """The weights one selected shard holds, as the operator knows them."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    weights_version: Annotated[int, Field(ge=0)] | None = None
    """The policy version of the shard's last successful refit; unset when unknown (never refit, restarted since,
    or being refit)."""
    stale: bool = False
    """Stale or Refitting: no traffic until refit."""


class RolloutFleetStatus(_KubeModel):
    """The healthy set the runtime follows, with counts and conditions. Written coalesced, only when it changes."""

    revision: Annotated[str, Field(max_length=64)] = ""
    """Digest of the healthy set: changes whenever the set (shards or environment servers) changes."""
    healthy: Annotated[str, Field(max_length=32)] = "0/0"
    """readyShards/totalShards, for kubectl."""
    ready_shards: Annotated[int, Field(ge=0)] = 0
    total_shards: Annotated[int, Field(ge=0)] = 0
    stale_shards: Annotated[int, Field(ge=0)] = 0
    """Selected shards that are Stale or Refitting (restarted since their last refit): no traffic until refit."""
    policy_version: Annotated[int, Field(ge=0)] | None = None
    """The trainer's policy version (from the fleet's PolicyVersion); unset while the trainer publishes none."""
    shard_weights: Annotated[list[ShardWeights], Field(max_length=10_000)] = Field(
        default_factory=list, json_schema_extra=_MAP_LIST_BY_NAME
    )
    """Every selected shard's weights, sorted by name: what the runtime gates answers by (max_weights_lag)."""
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


def read_fleet_status(status: Mapping[str, Any] | None) -> RolloutFleetStatus:
    """A RolloutFleet's ``status`` as a reader takes it: every field and list entry that validates, the rest dropped
    with a log line. None (no status written yet, or the fleet is gone) reads as the defaults.

    The operator writes the status through this model, but a reader (the trainer's runtime, ``rollout-fleet
    status``) may run another release than the operator, and one entry it cannot read must not blank the whole
    healthy set. Fields it does not know are ignored (``extra="ignore"``), as everywhere in this module.
    """
    data: dict[str, Any] = {k: list(v) if isinstance(v, list) else v for k, v in (status or {}).items()}
    while True:
        try:
            return RolloutFleetStatus.model_validate(data)
        except ValidationError as exc:
            dropped = _drop_invalid(data, exc)
            if not dropped:
                raise
            log.warning("RolloutFleet status: skipping what does not parse: %s", "; ".join(dropped)[:1000])


def _drop_invalid(data: dict[str, Any], exc: ValidationError) -> list[str]:
    """Remove from ``data`` each list entry (``loc`` = field, index, ...) or field an error names; what was dropped."""
    keys = {alias: name for name in data for alias in (name, to_camel(name))}
    entries: dict[str, set[int]] = {}
    fields: set[str] = set()
    for error in exc.errors():
        loc = error["loc"]
        key = keys.get(loc[0]) if loc and isinstance(loc[0], str) else None
        if key is None:
            continue
        if len(loc) >= 2 and isinstance(loc[1], int) and isinstance(data[key], list):
            entries.setdefault(key, set()).add(loc[1])
        else:
            fields.add(key)
    dropped = [f"{key}: {data.pop(key)!r}"[:200] for key in sorted(fields)]
    for key, indices in entries.items():
        if key not in fields:
            dropped += [f"{key}[{i}]: {data[key][i]!r}"[:200] for i in sorted(indices)]
            data[key] = [entry for i, entry in enumerate(data[key]) if i not in indices]
    return dropped


# ---------------------------------------------------------------------------------------------------------------
# PolicyVersion


_MAX_POLICY_VERSION: Final[int] = 1_000_000_000

RefitPhase = Literal["Refitting", "Succeeded", "Failed"]
"""Refitting: the update is under way (no traffic); Succeeded: the shard holds the version; Failed: it may hold
half-updated weights (Stale until a refit succeeds)."""


class RefitRecord(_KubeModel):
    """The trainer's latest refit of one shard."""

    shard: Annotated[str, Field(min_length=1, max_length=253)]
    """The GenerationShard's name (in the PolicyVersion's namespace)."""
    version: Annotated[int, Field(ge=0, le=_MAX_POLICY_VERSION)]
    """The policy version the shard now holds."""
    instance: Annotated[str, Field(max_length=256)] | None = None
    """The instance identity the refit landed on, in the form the operator observes for that shard (a pod's
    ``<uid>:<restarts>``, SGLang's weight version...); unset when the trainer reads none."""
    time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None
    """When the trainer recorded it: tells a new refit to the same version and instance from a replay."""
    phase: RefitPhase = "Succeeded"
    """Refitting: the update is under way (no traffic); Succeeded: the shard holds ``version``; Failed: it may hold
    half-updated weights (Stale until a refit succeeds)."""


_POLICY_RULES: Final[list[Any]] = [
    _cel(
        "self.refits.all(r, r.version <= self.policyVersion)",
        "a refit's version must not be ahead of policyVersion: publish the policy version first",
    ),
    _cel(
        "self.policyVersion >= oldSelf.policyVersion",
        "policyVersion must not go backwards: a new training run starts with a new PolicyVersion object",
    ),
]


class PolicyVersionSpec(_KubeModel):
    """The trainer's current policy version for the RolloutFleet of the same name, and the refits it made."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _POLICY_RULES})

    policy_version: Annotated[int, Field(ge=0, le=_MAX_POLICY_VERSION)]
    """The trainer's policy version (a step): shards lagging it by more than the fleet's maxWeightsLag are Stale."""
    refits: Annotated[list[RefitRecord], Field(max_length=10_000)] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["shard"]},
    )
    """The latest refit of each shard (one entry per shard)."""

    @model_validator(mode="after")
    def _refits_not_ahead(self) -> PolicyVersionSpec:
        for refit in self.refits:
            if refit.version > self.policy_version:
                raise ValueError(_POLICY_RULES[0]["message"])
        return self
