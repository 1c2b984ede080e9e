"""Simulated parts for the demo, tests and benchmarks: generation shards and a fleet of them.

The fleet names are imported on first use, so a sim shard process (which imports this package) does not pay for
the fleet's imports (health, shards) at startup.
"""

from typing import TYPE_CHECKING, Any

from rollout_runtime.sim.shard import (
    READY_PREFIX,
    SimFaults,
    SimShardConfig,
    count_tokens,
    create_app,
    expected_answer,
    vllm_context_length_message,
)

if TYPE_CHECKING:
    from rollout_runtime.sim.fleet import SimFleet, SimFleetError, SimShardProcess

_LAZY = {"SimFleet", "SimFleetError", "SimShardProcess"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from rollout_runtime.sim import fleet

        return getattr(fleet, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "READY_PREFIX",
    "SimFaults",
    "SimFleet",
    "SimFleetError",
    "SimShardConfig",
    "SimShardProcess",
    "count_tokens",
    "create_app",
    "expected_answer",
    "vllm_context_length_message",
]
