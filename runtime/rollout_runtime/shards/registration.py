"""Shards a trainer starts itself (vLLM servers in Ray actors, as NeMo-RL and verl run them), registered as
GenerationShard objects the operator probes like any other. Pure: builds the object; the API calls are
:meth:`~rollout_runtime.shards.kubernetes.KubernetesShardSource.register`'s.

Each registered object names its owner, the trainer's Pod or Job, in ``metadata.ownerReferences``: when the
trainer ends and its Pod or Job is deleted, Kubernetes' garbage collector deletes the GenerationShards with it, so
no shard outlives the run that started it. The owner must be in the same namespace (owner references never cross
namespaces). Inside the trainer pod, :meth:`OwnerRef.from_environment` reads the pod's name and UID from the
downward API (``POD_NAME`` / ``POD_UID`` from ``metadata.name`` / ``metadata.uid``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rollout_runtime.health.hysteresis import ProbeSettings
from rollout_runtime.kube.kinds import API_VERSION, GENERATION_SHARD

__all__ = ["FLEET_LABEL", "OwnerRef", "probe_spec", "registered_shard"]

FLEET_LABEL: Final[str] = "rolloutfleet.dev/fleet"
"""The label a registered shard carries by default: ``shardSelector: {matchLabels: {rolloutfleet.dev/fleet: <fleet>}}``
selects what a trainer registers for that fleet."""
_OWNER_API_VERSIONS: Final[Mapping[str, str]] = {"Pod": "v1", "Job": "batch/v1"}


class OwnerRef(BaseModel):
    """The object whose deletion deletes the registered shards: the trainer's Pod or Job (same namespace)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["Pod", "Job"]
    name: str = Field(min_length=1, max_length=253)
    uid: str = Field(min_length=1, max_length=128)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> OwnerRef:
        """The trainer's own Pod, from downward-API variables ``POD_NAME`` and ``POD_UID``."""
        env = os.environ if env is None else env
        name, uid = env.get("POD_NAME", ""), env.get("POD_UID", "")
        if not name or not uid:
            raise LookupError(
                "POD_NAME and POD_UID are not set: add them to the trainer container from the downward API"
                " (env valueFrom.fieldRef.fieldPath metadata.name and metadata.uid), or pass an OwnerRef"
            )
        return cls(kind="Pod", name=name, uid=uid)

    def to_kube(self) -> dict[str, Any]:
        """An ``ownerReferences`` entry (not a controller, and it does not block the owner's deletion)."""
        return {"apiVersion": _OWNER_API_VERSIONS[self.kind], "kind": self.kind, "name": self.name, "uid": self.uid}


def probe_spec(probe: Mapping[str, Any]) -> dict[str, Any]:
    """A GenerationShard's ``spec.probe`` from the fields given (snake_case or camelCase names).

    ``ProbeSettings`` checks them first, so a bad probe fails here saying what to fix (the API server would drop a
    snake_case name silently). Only the given fields are written: the CRD defaults the rest (``checkModel`` on) and
    an unset timeout follows the period when the operator reads the object, as it does in ``ProbeSettings``.
    """
    wire = ProbeSettings.model_validate(dict(probe)).model_dump(mode="json", by_alias=True)
    return {
        to_camel(name): wire[to_camel(name)]
        for name in ProbeSettings.model_fields
        if {name, to_camel(name)} & set(probe)
    }


def registered_shard(
    name: str,
    endpoint: str,
    *,
    owner: OwnerRef,
    fleet: str,
    labels: Mapping[str, str] | None = None,
    model: str = "",
    max_model_len: int | None = None,
    probe: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The GenerationShard object for a shard the trainer started (labels default to ``FLEET_LABEL: fleet``)."""
    spec: dict[str, Any] = {"endpoint": endpoint, "model": model}
    if max_model_len is not None:
        spec["maxModelLen"] = max_model_len
    if probe is not None:
        spec["probe"] = probe_spec(probe)
    return {
        "apiVersion": API_VERSION,
        "kind": GENERATION_SHARD.kind,
        "metadata": {
            "name": name,
            "labels": dict(labels) if labels is not None else {FLEET_LABEL: fleet},
            "ownerReferences": [owner.to_kube()],
        },
        "spec": spec,
    }
