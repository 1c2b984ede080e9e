"""The Kubernetes vocabulary the runtime and the operator share: kind names, client configuration, API errors.

- :mod:`~rollout_runtime.kube.kinds`: group, version and each kind's names (pure data);
- :func:`load_client_configuration`: one precedence for where credentials come from;
- :func:`api_error_is_transient`: one rule for which API errors are worth retrying.

The operator imports these; the runtime never imports the operator. The kinds load eagerly; the other two load
kubernetes_asyncio, so they are imported on first use (like ``rollout_runtime.shards.KubernetesShardSource``).
"""

from typing import TYPE_CHECKING, Any

from rollout_runtime.kube.kinds import (
    API_VERSION,
    BY_KIND,
    ENVIRONMENT_SERVER,
    GENERATION_SHARD,
    GROUP,
    KINDS,
    ROLLOUT_FLEET,
    VERSION,
    KindNames,
)

if TYPE_CHECKING:
    from rollout_runtime.kube.config import load_client_configuration
    from rollout_runtime.kube.errors import api_error_is_transient

__all__ = [
    "API_VERSION",
    "BY_KIND",
    "ENVIRONMENT_SERVER",
    "GENERATION_SHARD",
    "GROUP",
    "KINDS",
    "ROLLOUT_FLEET",
    "VERSION",
    "KindNames",
    "api_error_is_transient",
    "load_client_configuration",
]


def __getattr__(name: str) -> Any:
    """The client-side helpers are imported on first use: the kind names alone never load kubernetes_asyncio."""
    if name == "load_client_configuration":
        from rollout_runtime.kube.config import load_client_configuration

        return load_client_configuration
    if name == "api_error_is_transient":
        from rollout_runtime.kube.errors import api_error_is_transient

        return api_error_is_transient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
