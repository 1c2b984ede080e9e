"""The trainer's PolicyVersion objects, read and decided on: pure (no I/O; :mod:`fleet_operator.refits` applies them).

One PolicyVersion per RolloutFleet (same name, same namespace) carries the trainer's policy version and its refits
(shard, version, the instance identity the refit landed on). The trainer may write only that kind (its chart Role),
never a spec or a status, so the operator stays the one writer of health. From it the operator decides:

- which refits to apply (:func:`refits_to_apply`): each new entry once (``Refitting``: no traffic while the
  update runs; ``Succeeded``: the shard holds the version; ``Failed``: Stale until a refit succeeds). A watch
  re-lists everything after a restart or 410 Gone, so an entry the operator has not applied *in this run* may be a
  replay of an old refit: on the first sighting of an object, a Succeeded entry lifts a Stale shard only when its
  instance is the instance the shard runs now (evidence that the refit was of this process); otherwise it is only
  the baseline, and the trainer's next refit of that shard brings it back;
- which shard a refit names (:func:`refit_targets`): a trainer refits a shard under the name the fleet's status
  publishes, a GenerationShard's own name or, for a pod member of that fleet, its pod's name;
- which members lag (:func:`lagging`): a refit version more than the fleet's ``maxWeightsLag`` behind the policy
  version makes the shard Stale (no traffic) until refit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from fleet_operator.decisions import GENERATION_SHARD, Member, selected_members
from fleet_operator.discovery import target_name
from fleet_operator.records import FleetKey
from rollout_runtime.health import HealthState
from rollout_runtime.kube.api import PolicyVersionSpec, RefitRecord, RolloutFleetSpec
from rollout_runtime.redaction import safe_message

__all__ = ["PolicyObservation", "lagging", "observe_policy", "refit_targets", "refits_to_apply"]


@dataclass(frozen=True)
class PolicyObservation:
    """A PolicyVersion as one watch event shows it (``spec`` None: invalid, with ``invalid`` saying why)."""

    key: FleetKey
    uid: str
    spec: PolicyVersionSpec | None
    invalid: str | None = None


def observe_policy(body: Mapping[str, Any]) -> PolicyObservation:
    """Read a PolicyVersion's event body; an invalid spec (one that slipped past an older CRD) is ignored, not
    raised."""
    meta = body.get("metadata") or {}
    key = FleetKey(meta.get("namespace", ""), meta.get("name", ""))
    try:
        return PolicyObservation(key, meta.get("uid", ""), PolicyVersionSpec.model_validate(body.get("spec") or {}))
    except ValidationError as exc:
        reason = safe_message(f"invalid spec: {exc.errors()[0].get('msg', exc)}", 1024)
        return PolicyObservation(key, meta.get("uid", ""), None, reason)


def refit_targets(fleet: str, targets: Iterable[str]) -> dict[str, str]:
    """The fleet's shard targets by the name its PolicyVersion's refits use: the name the fleet's status publishes.

    A GenerationShard is its own name; a pod member of this fleet is its pod's name (its target is
    ``<fleet>/<pod>``, :func:`~fleet_operator.discovery.target_name`); another fleet's pod members are not this
    PolicyVersion's. A GenerationShard and a pod member of one name: the GenerationShard (as the status would show
    both under that name, a trainer cannot tell them apart; name them apart).
    """
    prefix = target_name(fleet, "")
    names = list(targets)
    named = {target.removeprefix(prefix): target for target in names if target.startswith(prefix)}
    named.update({target: target for target in names if "/" not in target})
    return named


def refits_to_apply(
    refits: Iterable[RefitRecord],
    applied: Mapping[str, RefitRecord],
    states: Mapping[str, HealthState],
    *,
    first_sighting: bool,
) -> tuple[list[RefitRecord], list[RefitRecord]]:
    """The refits to apply now, and the ones only to remember as applied (see the module docstring).

    ``applied``: by shard, the entry last applied (or remembered) in this run; ``states``: the known shards'
    states (an entry for an unknown shard waits until the shard is known).
    """
    apply: list[RefitRecord] = []
    baseline: list[RefitRecord] = []
    for refit in refits:
        state = states.get(refit.shard)
        if state is None or applied.get(refit.shard) == refit:
            continue
        held_back = state.stale or state.refitting
        lifts = refit.phase == "Succeeded"  # Refitting and Failed only take traffic away: always safe to apply
        if first_sighting and lifts and held_back and (refit.instance is None or refit.instance != state.instance):
            baseline.append(refit)
        else:
            apply.append(refit)
    return apply, baseline


def lagging(spec: RolloutFleetSpec, members: Iterable[Member], policy_version: int, fleet: str) -> list[str]:
    """The target names of the fleet's shards (objects and pod members) whose weights lag ``policy_version`` by more
    than its ``maxWeightsLag``."""
    max_lag = spec.policy.max_weights_lag
    return sorted(
        target_name(fleet, m.name) if m.fleet is not None else m.name
        for m in selected_members(list(members), GENERATION_SHARD, spec.shard_selector, fleet)
        if m.weights_version is not None and policy_version - m.weights_version > max_lag
    )
