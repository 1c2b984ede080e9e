"""The names of the four custom resources (group, version, each kind's kind, plural, singular and short names), and
of the built-in kinds the operator watches to discover members (Pods, EndpointSlices).

The one place they are spelled. The operator's CRDs (``fleet_operator.crds`` adds the schemas, printer columns and
descriptions), its watches, status writes and Events, the ``status`` CLI and the runtime's KubernetesShardSource
all read them from here, so a renamed plural or a new version is one edit. Pure data: importing it loads no client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "API_VERSION",
    "BUILTIN_KINDS",
    "BY_KIND",
    "ENDPOINT_SLICE",
    "ENVIRONMENT_SERVER",
    "GENERATION_SHARD",
    "GROUP",
    "KINDS",
    "POD",
    "POLICY_VERSION",
    "ROLLOUT_FLEET",
    "VERSION",
    "BuiltinKind",
    "KindNames",
]

GROUP: Final[str] = "rolloutfleet.dev"
VERSION: Final[str] = "v1alpha1"
API_VERSION: Final[str] = f"{GROUP}/{VERSION}"
"""What an object's ``apiVersion`` says (and what an Event's ``involvedObject`` refers to)."""


@dataclass(frozen=True)
class KindNames:
    """How Kubernetes names one kind: in objects (``kind``), in URLs (``plural``) and on kubectl's command line."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def crd_name(self) -> str:
        """The CustomResourceDefinition's name, ``<plural>.<group>``."""
        return f"{self.plural}.{GROUP}"


GENERATION_SHARD: Final[KindNames] = KindNames("GenerationShard", "generationshards", "generationshard", ("gshard",))
ENVIRONMENT_SERVER: Final[KindNames] = KindNames(
    "EnvironmentServer", "environmentservers", "environmentserver", ("envsrv",)
)
ROLLOUT_FLEET: Final[KindNames] = KindNames("RolloutFleet", "rolloutfleets", "rolloutfleet", ("rfleet",))
POLICY_VERSION: Final[KindNames] = KindNames("PolicyVersion", "policyversions", "policyversion", ("polver",))
"""The trainer's word on weights for one fleet (same name as the RolloutFleet): written by the trainer only."""
KINDS: Final[tuple[KindNames, ...]] = (GENERATION_SHARD, ENVIRONMENT_SERVER, ROLLOUT_FLEET, POLICY_VERSION)
BY_KIND: Final[Mapping[str, KindNames]] = {names.kind: names for names in KINDS}
"""``kind`` -> its names (the engine keys records by kind and writes by plural)."""


@dataclass(frozen=True)
class BuiltinKind:
    """A Kubernetes built-in kind the operator reads (never writes): where it is served and what it is called."""

    group: str
    """API group; "" is the core group (``/api/v1``)."""
    version: str
    kind: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


POD: Final[BuiltinKind] = BuiltinKind("", "v1", "Pod", "pods")
ENDPOINT_SLICE: Final[BuiltinKind] = BuiltinKind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices")
BUILTIN_KINDS: Final[Mapping[str, BuiltinKind]] = {names.plural: names for names in (POD, ENDPOINT_SLICE)}
"""``plural`` -> the built-in kind (the engine lists them by plural, like its own kinds)."""
