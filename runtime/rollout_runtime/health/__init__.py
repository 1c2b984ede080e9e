"""Shard health: probe results through a hysteresis state machine, shared by the runtime and the operator.

- :mod:`.hysteresis`: the pure state machine (phases, settings, results, transitions).
- :mod:`.targets`: which URLs may be probed (an SSRF allowlist).
- :mod:`.probe`: the HTTP prober for OpenAI-compatible shards and environment servers.
- :mod:`.schedule`: when each target's next probe is due (pure, one timer per target).
- :mod:`.monitor`: a loop that probes each target on its own timer and feeds their states.
"""

from rollout_runtime.health.hysteresis import (
    MAX_PROBE_MESSAGE_CHARS,
    WEIGHTS_REASONS,
    HealthPhase,
    HealthState,
    ProbeReason,
    ProbeResult,
    ProbeSettings,
    Transition,
)
from rollout_runtime.health.monitor import (
    CLOCK_SLACK_SECONDS,
    HealthMonitor,
    ProbeRound,
    ProbeTarget,
    TransitionCallback,
)
from rollout_runtime.health.probe import DEFAULT_MAX_BODY_BYTES, MODELS_PATH, HttpProber, Prober, check_model_list
from rollout_runtime.health.schedule import ProbeSchedule
from rollout_runtime.health.targets import ForbiddenProbeTarget, ProbeTargetPolicy, TargetVerdict

__all__ = [
    "CLOCK_SLACK_SECONDS",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_PROBE_MESSAGE_CHARS",
    "MODELS_PATH",
    "WEIGHTS_REASONS",
    "ForbiddenProbeTarget",
    "HealthMonitor",
    "HealthPhase",
    "HealthState",
    "HttpProber",
    "ProbeReason",
    "ProbeResult",
    "ProbeRound",
    "ProbeSchedule",
    "ProbeSettings",
    "ProbeTarget",
    "ProbeTargetPolicy",
    "Prober",
    "TargetVerdict",
    "Transition",
    "TransitionCallback",
    "check_model_list",
]
