pytest_plugins = [
    "support.loops",
    "support.tools",
    "support.controlplane",
    "support.helm",
    "support.prometheus",
    "support.chart",
    "support.chart_cluster",
    "support.kmockfix",
    "support.operator",
]
