"""rollout-fleet runtime: the library embedded in the trainer's single controller.

Public names are re-exported here so users import from one place.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from rollout_runtime.failures import (
    FailureClass,
    GenerationUnavailable,
    GymTransportError,
    NoHealthyShards,
    RolloutDataFailure,
    RolloutFailure,
    RolloutInfraFailure,
    RolloutRedispatchExhausted,
    RolloutStall,
    RolloutTerminalDataFailure,
    RolloutTimeout,
    classify_rollout_failure,
    http_status_is_infra,
    picklable_failures,
    to_picklable_failure,
)

try:
    __version__ = version("rollout-fleet")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = [
    "FailureClass",
    "GenerationUnavailable",
    "GymTransportError",
    "NoHealthyShards",
    "RolloutDataFailure",
    "RolloutFailure",
    "RolloutInfraFailure",
    "RolloutRedispatchExhausted",
    "RolloutStall",
    "RolloutTerminalDataFailure",
    "RolloutTimeout",
    "__version__",
    "classify_rollout_failure",
    "http_status_is_infra",
    "picklable_failures",
    "to_picklable_failure",
]
