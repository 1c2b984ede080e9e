"""The Kubernetes vocabulary the runtime and the operator share, one concept per module.

- :mod:`~rollout_runtime.kube.kinds`: group, version and each kind's names (pure data, loads no client);
- :mod:`~rollout_runtime.kube.api`: the four kinds' specs and statuses as pydantic models (the operator writes and
  generates its CRDs from them; the runtime reads a fleet's status with them);
- :mod:`~rollout_runtime.kube.config`: ``load_client_configuration``, one precedence for where credentials come from;
- :mod:`~rollout_runtime.kube.errors`: ``api_error_is_transient``, one rule for which API errors are worth retrying.

The operator imports these; the runtime never imports the operator. ``config`` and ``errors`` load kubernetes_asyncio
(slow to import), so nothing is re-exported here: import the module you need.
"""
