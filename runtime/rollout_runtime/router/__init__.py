"""``rollout-fleet router``: an OpenAI-compatible policy endpoint for environment and agent servers.

Point an environment server's policy base URL (NeMo-Gym's ``policy_base_url``) at it; every model call then gets
the dispatcher's selection, failure classification, passive ejection and session affinity.
"""

from rollout_runtime.router.app import (
    ATTEMPTS_HEADER,
    READY_PREFIX,
    SHARD_HEADER,
    WEIGHTS_HEADER,
    Router,
    RouterServer,
    serve_router,
    stream_error_event,
)
from rollout_runtime.router.config import DEFAULT_AFFINITY_HEADER, RouterConfig
from rollout_runtime.router.metrics import REFUSALS, RouterMetrics
from rollout_runtime.router.upstream import Forward, Relayed, ShardRejected, StreamInterrupted, StreamRelay

__all__ = [
    "ATTEMPTS_HEADER",
    "DEFAULT_AFFINITY_HEADER",
    "READY_PREFIX",
    "REFUSALS",
    "SHARD_HEADER",
    "WEIGHTS_HEADER",
    "Forward",
    "Relayed",
    "Router",
    "RouterConfig",
    "RouterMetrics",
    "RouterServer",
    "ShardRejected",
    "StreamInterrupted",
    "StreamRelay",
    "serve_router",
    "stream_error_event",
]
