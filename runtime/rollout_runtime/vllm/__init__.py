"""Real vLLM servers on 127.0.0.1 (the CPU build, ``scripts/install-tools.sh vllm``): the tiny model, the process
group wrapper and vLLM's own refit endpoints. Used by the real-vLLM test tier, the benchmarks and the demo."""

from rollout_runtime.vllm.server import (
    MAX_MODEL_LEN,
    MODEL_NAME,
    VllmServer,
    generate_tiny_model,
    group_members,
    server_argv,
    server_env,
)

__all__ = [
    "MAX_MODEL_LEN",
    "MODEL_NAME",
    "VllmServer",
    "generate_tiny_model",
    "group_members",
    "server_argv",
    "server_env",
]
