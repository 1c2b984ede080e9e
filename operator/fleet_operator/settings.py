"""The operator's configuration: one typed object, read from ``FLEET_OPERATOR_*`` environment variables.

List values accept JSON (``["a","b"]``) or a comma-separated string (``a,b``). :func:`load_settings` is how the
operator reads them at start: a bad value becomes one line naming the variable and what to fix, not a traceback.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from rollout_runtime.health import ProbeTargetPolicy

__all__ = ["InvalidSettings", "OperatorSettings", "load_settings"]

ENV_PREFIX = "FLEET_OPERATOR_"


def _default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _default_lease_namespace() -> str:
    """The pod's namespace when in a cluster (downward API or the service-account mount), else "default"."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    mounted = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return mounted.read_text().strip() or "default"
    except OSError:
        return "default"


class OperatorSettings(BaseSettings):
    """Everything the operator can be told; every field is an environment variable ``FLEET_OPERATOR_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # --- where -----------------------------------------------------------------------------------------------
    kubeconfig: Path | None = None
    """Kubeconfig file; unset: the in-cluster service account, else $KUBECONFIG / ~/.kube/config."""
    namespaces: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Namespaces to watch; empty: cluster-wide."""

    # --- probing safety --------------------------------------------------------------------------------------
    probe_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Hosts (fnmatch patterns like ``*.gpu.internal``) or CIDR blocks that explicit spec.endpoint URLs may use.
    Empty (the default): only in-cluster Service names are probed; explicit URLs are refused."""
    probe_allow_cluster_services: bool = True
    """Allow ``<svc>.<ns>.svc[.<clusterDomain>]`` hosts (what serviceRef resolves to) without listing them."""
    probe_allow_loopback: bool = False
    """Allow 127.0.0.0/8 and localhost (tests and local development only)."""
    cluster_domain: str = "cluster.local"
    pod_discovery: bool = True
    """Watch Pods and EndpointSlices (list + watch, in ``namespaces``) for fleets' ``shardPods`` and
    ``environmentServerPods``. Pod IPs are probed only if the allowlist admits them: list the pod network's CIDR in
    ``probe_allowed_hosts``. Off: pod selections stay empty and no pod RBAC is needed."""
    probe_max_body_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = 64 * 1024
    """Bound on every probe response body read."""
    probe_concurrency: Annotated[int, Field(ge=1, le=10_000)] = 128
    """Probes in flight at once, across all targets."""

    # --- writes ----------------------------------------------------------------------------------------------
    status_heartbeat_seconds: Annotated[float, Field(gt=0, le=3600)] = 60.0
    """Between transitions, a target's latency/last-probe fields and a fleet's heartbeat are written at most this
    often. Transitions are written at once."""
    fleet_coalesce_seconds: Annotated[float, Field(ge=0, le=60)] = 0.5
    """A fleet's status is written this long after the first change that dirtied it, so a burst of shard
    transitions becomes one write."""
    write_retry_seconds: Annotated[float, Field(gt=0, le=300)] = 2.0
    """Delay before retrying a failed status write (doubling to 30 s)."""
    reporting_component: str = "rollout-fleet-operator"
    """Event source component."""

    # --- high availability ----------------------------------------------------------------------------------
    leader_election: bool = True
    """Run several replicas: only the holder of the Lease reconciles; the others wait as hot standbys."""
    lease_name: str = "rollout-fleet-operator"
    lease_namespace: str = Field(default_factory=_default_lease_namespace)
    identity: str = Field(default_factory=_default_identity)
    lease_duration_seconds: Annotated[float, Field(gt=0, le=600)] = 15.0
    """A standby takes over once the leader has not renewed for this long."""
    lease_renew_seconds: Annotated[float, Field(gt=0, le=600)] = 5.0
    """How often the leader renews (and a standby retries)."""

    # --- serving ---------------------------------------------------------------------------------------------
    http_host: str = "0.0.0.0"  # the pod's probe and scrape port
    http_port: Annotated[int, Field(ge=0, le=65535)] = 8080
    """/healthz (liveness), /readyz, /metrics. 0 picks a free port (tests)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    shutdown_timeout_seconds: Annotated[float, Field(gt=0, le=300)] = 20.0
    """Graceful shutdown: time allowed for in-flight writes and the Lease release."""

    @field_validator("namespaces", "probe_allowed_hosts", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                try:
                    return json.loads(text)
                except json.JSONDecodeError as error:
                    raise ValueError(f'not a JSON list ({error.msg}); write ["a","b"] or a,b') from None
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("probe_allowed_hosts")
    @classmethod
    def _valid_allowlist(cls, value: list[str]) -> list[str]:
        """Refuse a bad host pattern or CIDR now, not at the first probe (ProbeTargetPolicy owns the rule)."""
        try:
            ProbeTargetPolicy(allowed_hosts=tuple(value))
        except ValidationError as error:
            reasons = "; ".join(_reason(detail["msg"]) for detail in error.errors(include_url=False))
            raise ValueError(f"{reasons}; list hosts (patterns like *.gpu.internal) or CIDR blocks, not URLs") from None
        return value

    @model_validator(mode="after")
    def _lease_timing(self) -> OperatorSettings:
        if self.lease_renew_seconds >= self.lease_duration_seconds:
            raise ValueError(
                f"lease_renew_seconds must be less than lease_duration_seconds ({ENV_PREFIX}LEASE_RENEW_SECONDS="
                f"{self.lease_renew_seconds:g}, {ENV_PREFIX}LEASE_DURATION_SECONDS={self.lease_duration_seconds:g}): "
                "lower the renew interval (a third of the lease duration is usual) or raise the lease duration"
            )
        return self

    def probe_policy(self) -> ProbeTargetPolicy:
        """The one probe allowlist every probe is checked against."""
        return ProbeTargetPolicy(
            allowed_hosts=tuple(self.probe_allowed_hosts),
            allow_cluster_services=self.probe_allow_cluster_services,
            cluster_domain=self.cluster_domain,
            allow_loopback=self.probe_allow_loopback,
        )


class InvalidSettings(ValueError):
    """The ``FLEET_OPERATOR_*`` environment does not make valid settings; the message is one line for the log."""


def _reason(message: str) -> str:
    """A validator's message without pydantic's prefix, on one line."""
    return " ".join(message.removeprefix("Value error, ").split())


def describe_invalid(error: ValidationError) -> str:
    """One line naming each offending ``FLEET_OPERATOR_*`` variable, the value it had and what it must be."""
    problems = []
    for detail in error.errors(include_url=False):
        if detail["loc"]:
            variable = f"{ENV_PREFIX}{str(detail['loc'][0]).upper()}"
            problems.append(f"{variable}={detail['input']!r}: {_reason(detail['msg'])}")
        else:  # a rule across several variables: its message names them
            problems.append(_reason(detail["msg"]))
    return "invalid operator settings: " + "; ".join(problems)


def load_settings() -> OperatorSettings:
    """The settings from the environment, or :class:`InvalidSettings` with a one-line description of what to fix."""
    try:
        return OperatorSettings()
    except ValidationError as error:
        raise InvalidSettings(describe_invalid(error)) from None
