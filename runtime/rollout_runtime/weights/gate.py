"""Whether a result may be committed, given the weights that produced it: a pure decision.

The dispatcher asks once per successful attempt. A result is committed only when the shard held one known policy
version from the attempt's start to its answer, and that version is within ``max_weights_lag`` of the trainer's
policy version *at the time it answers*: a shard that restarted (Stale, version unknown), was refit mid-attempt
(the version changed under the request: half-old, half-new tokens) or lags too far behind produces an off-policy
sample, which is redispatched instead (a *stale attempt*: infra, charged to no budget, like an eviction).

When the trainer never published a policy version, weights are not tracked and every result commits, stamped with
whatever version the shard is known to hold (the behaviour before weights tracking).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

__all__ = ["MAX_LAG_LABEL", "WeightsVerdict", "WeightsView", "lag_label", "weights_verdict"]

MAX_LAG_LABEL: Final[int] = 10
"""Lags above this share one metric label value (``"10+"``), so the label set stays bounded."""


@dataclass(frozen=True, slots=True)
class WeightsVerdict:
    """The decision for one answer: commit it or not, the version to stamp it with, and why not."""

    committable: bool
    version: int | None
    """The weights version the answer was produced at (None when unknown)."""
    lag: int | None
    """Policy version minus ``version``; None when either is unknown."""
    reason: str = ""


def weights_verdict(
    policy_version: int | None, started_version: int | None, answered_version: int | None, max_lag: int
) -> WeightsVerdict:
    """Decide whether an answer is on-policy enough to commit (see the module docstring).

    ``started_version`` and ``answered_version`` are the shard's known weights version when the attempt started and
    when it answered; ``policy_version`` is the trainer's at the answer.
    """
    if max_lag < 0:
        raise ValueError(f"max_weights_lag must be >= 0, got {max_lag}")
    if policy_version is None:
        return WeightsVerdict(True, answered_version, None)
    if answered_version is None:
        return WeightsVerdict(False, None, None, "the shard's weights version is unknown (stale or refitting)")
    if started_version != answered_version:
        return WeightsVerdict(
            False,
            answered_version,
            policy_version - answered_version,
            f"the shard's weights changed during the attempt ({started_version} -> {answered_version})",
        )
    lag = policy_version - answered_version
    if lag < 0:
        return WeightsVerdict(False, answered_version, lag, f"weights version {answered_version} is ahead of policy")
    if lag > max_lag:
        return WeightsVerdict(
            False, answered_version, lag, f"weights version {answered_version} lags policy {policy_version} by {lag}"
        )
    return WeightsVerdict(True, answered_version, lag)


def lag_label(lag: int | None) -> str:
    """The bounded ``lag`` label value of ``rollout_committed_results_total``: ``"0"``.. ``"10+"``, ``"unknown"``."""
    if lag is None:
        return "unknown"
    return f"{MAX_LAG_LABEL}+" if lag >= MAX_LAG_LABEL else str(lag)


@runtime_checkable
class WeightsView(Protocol):
    """What the dispatcher reads of weights: the trainer's policy version and each shard's known version.

    :class:`~rollout_runtime.weights.WeightsTracker` is one; a Kubernetes source can be another (it reads the
    fleet's status).
    """

    @property
    def policy_version(self) -> int | None: ...

    def version_of(self, shard: str) -> int | None: ...

    def stale_shards(self) -> Mapping[str, bool]: ...
