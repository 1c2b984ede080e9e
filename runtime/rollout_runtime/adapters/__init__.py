"""Trainer integrations: an AsyncOpenAI-shaped client, NeMo-RL-style batch generation, a verl server rollout.

Each routes through the dispatcher (retries, ejection, progress watchdog, exactly-once accounting) and returns the
typed token-level results of :mod:`rollout_runtime.results`.
"""

from rollout_runtime.adapters.batch import BatchGeneration, FleetGenerateServer, TokenOutput, generate_batch
from rollout_runtime.adapters.openai import (
    ChatCompletionObject,
    CompletionObject,
    DispatchedOpenAI,
    RolloutRequestFailed,
)

__all__ = [
    "BatchGeneration",
    "ChatCompletionObject",
    "CompletionObject",
    "DispatchedOpenAI",
    "FleetGenerateServer",
    "RolloutRequestFailed",
    "TokenOutput",
    "generate_batch",
]
