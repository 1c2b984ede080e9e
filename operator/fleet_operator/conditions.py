"""metav1.Condition helpers: a condition's lastTransitionTime moves only when its status flips.

Pure functions over lists of :class:`~rollout_runtime.kube.api.Condition`; the clock is a parameter.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from rollout_runtime.kube.api import Condition, ConditionStatus

__all__ = ["find_condition", "rfc3339", "set_condition"]


def rfc3339(timestamp: float) -> str:
    """Unix time -> the API server's metav1.Time form (second precision, UTC, trailing Z)."""
    return dt.datetime.fromtimestamp(int(timestamp), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    now: float,
    observed_generation: int | None = None,
) -> list[Condition]:
    """Return ``conditions`` with ``type_`` set; its lastTransitionTime is kept unless ``status`` changes.

    Reason, message and observedGeneration are always updated (they describe the latest observation).
    Order is kept; a new type is appended.
    """
    previous = find_condition(conditions, type_)
    transition_time = (
        previous.last_transition_time if previous is not None and previous.status == status else rfc3339(now)
    )
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message[:32768],
        last_transition_time=transition_time,
        observed_generation=observed_generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type_ else c for c in conditions]
