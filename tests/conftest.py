"""Suite-wide configuration: fixture plugins, and Hypothesis without per-example deadlines.

A Hypothesis deadline is a timing assertion: on a loaded two-core CI machine an example can take 200 ms for no
fault of the code, and that must not fail the run. Property tests bound their work by size, not by time.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("rollout-fleet", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("rollout-fleet")

pytest_plugins = [
    "support.loops",
    "support.tools",
    "support.controlplane",
    "support.controllers",
    "support.netns",
    "support.helm",
    "support.prometheus",
    "support.chart",
    "support.chart_cluster",
    "support.kmockfix",
    "support.operator",
    "support.weights",
    "support.llama",
    "support.node",
    "support.vllm",
]
