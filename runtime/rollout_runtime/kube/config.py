"""Where the API server and its credentials come from: one precedence for the operator and the trainer's source.

1. an explicit kubeconfig file (``FLEET_OPERATOR_KUBECONFIG``, ``status --kubeconfig``, the source's ``kubeconfig=``);
2. else the in-cluster service account, when one is mounted (the chart's operator, a trainer pod);
3. else the default kubeconfig: ``$KUBECONFIG``, else ``~/.kube/config`` (a laptop, CI, the tests).

This is the order the operator's settings and CLI have always documented. In-cluster wins over ``$KUBECONFIG``
(controller-runtime's ``GetConfig`` puts ``$KUBECONFIG`` first) because in a pod the service account is what RBAC
was written for; a pod meant to reach another cluster passes the file explicitly. "Mounted" is decided by trying:
a pod without a token (``automountServiceAccountToken: false``) but with a kubeconfig falls through to step 3.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config import kube_config

__all__ = ["default_kubeconfig_paths", "load_client_configuration"]


def default_kubeconfig_paths() -> list[Path]:
    """The files step 3 reads: ``$KUBECONFIG`` (a list, split as kubectl does), else ``~/.kube/config``; as the
    client read them at import."""
    listed = str(kube_config.KUBE_CONFIG_DEFAULT_LOCATION).split(os.pathsep)
    return [Path(p).expanduser() for p in listed if p]


def _existing(paths: list[Path]) -> None:
    """ConfigException naming the files when none exists (the client would only log a warning and read nothing)."""
    if not any(p.is_file() for p in paths):
        raise config.ConfigException(f"no kubeconfig file at {os.pathsep.join(map(str, paths))}")


async def load_client_configuration(kubeconfig: str | Path | None = None) -> client.Configuration:
    """A client Configuration by the precedence above; ConfigException naming both reasons when nothing works."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        _existing([Path(kubeconfig)])
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        return configuration
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException as not_in_cluster:
        configuration = client.Configuration()  # nothing half-set by the in-cluster attempt
        try:
            _existing(default_kubeconfig_paths())
            await config.load_kube_config(client_configuration=configuration)
        except config.ConfigException as no_kubeconfig:
            raise config.ConfigException(
                f"no Kubernetes credentials: no kubeconfig given, no in-cluster service account ({not_in_cluster}), "
                f"and no default kubeconfig ({no_kubeconfig})"
            ) from no_kubeconfig
    return configuration
