"""Whether a failed Kubernetes API call is worth making again: the one answer every client here uses.

Transient (waiting can fix it): a lost or refused connection or a timeout, and an API server answer whose status
:func:`rollout_runtime.failures.http_status_is_infra` counts as the server's weather: every 5xx, 429 (throttled,
or a new CRD's storage still initialising), 408 and 425. Not transient (someone must change something): every other
4xx (401/403 credentials or RBAC, 404, 409, 410, 422 a rejected object), an ApiException without an HTTP status
(kubernetes_asyncio raises ``status=0`` when it could not even build the request), a malformed URL, and anything
that is not an API or transport error at all.

Status codes with a meaning of their own stay explicit checks at the call site, on top of this rule: 404 "the object
is gone", 409/422 on a Lease "another candidate won", 410 on a watch "re-list". What a caller does with a
non-transient error is its own policy too: the priming list and ``rollout-fleet status`` raise it, while loops that
must never give up (the status writer, leader election, the trainer's watch, as client-go's reflector and
leaderelection do) retry it with backoff and log it as an error rather than a warning.
"""

from __future__ import annotations

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from rollout_runtime.failures import http_status_is_infra

__all__ = ["api_error_is_transient"]


def api_error_is_transient(exc: BaseException) -> bool:
    """True if the same call may succeed later without anyone changing anything (see the module docstring). Pure."""
    if isinstance(exc, ApiException):
        status = exc.status
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            return False
        return http_status_is_infra(status)
    if isinstance(exc, aiohttp.InvalidURL):  # a ClientError, but the kubeconfig's fault, not the network's
        return False
    return isinstance(exc, OSError | TimeoutError | aiohttp.ClientError)
