"""The operator's own API calls (status patches, Events, initial lists), over kubernetes_asyncio.

kopf watches; these are the writes it cannot make for us from outside a handler. :class:`KubeApi` is the narrow
interface the engine depends on, so reconciliation tests can count calls or point it at kmock.
"""

from __future__ import annotations

import datetime as dt
import enum
import inspect
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rollout_runtime.kube import kinds
from rollout_runtime.kube.errors import api_error_is_transient
from rollout_runtime.kube.kinds import API_VERSION, GROUP, VERSION

__all__ = [
    "KubeApi",
    "KubeClient",
    "ObjectRef",
    "StatusWriteError",
    "WriteOutcome",
    "connection_info",
]


class WriteOutcome(enum.Enum):
    WRITTEN = "written"
    GONE = "gone"
    """The object no longer exists (404): the caller forgets it."""


class StatusWriteError(RuntimeError):
    """A write failed. The engine retries it with backoff whatever the cause: statuses are recomputed every pass,
    so a write refused for a reason someone fixes later (RBAC, an older CRD) heals without a restart.
    """

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient
        """``api_error_is_transient`` of the cause; False: waiting alone will not help (the engine logs an error)."""


class ObjectRef(Protocol):
    kind: str
    namespace: str
    name: str
    uid: str


class KubeApi(Protocol):
    """What the engine needs from the API server."""

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> WriteOutcome: ...

    async def post_event(self, ref: ObjectRef, *, type_: str, reason: str, message: str) -> None: ...

    async def list_objects(self, plural: str, namespace: str | None) -> list[dict[str, Any]]: ...


async def connection_info(configuration: client.Configuration) -> kopf.ConnectionInfo:
    """The same credentials for kopf's watches as for our writes (one source of truth for both clients)."""
    maybe_header: Any = configuration.get_api_key_with_prefix("BearerToken")
    header: str | None = await maybe_header if inspect.isawaitable(maybe_header) else maybe_header
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=configuration.host or "",
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def _now() -> str:
    return dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeClient:
    """KubeApi over kubernetes_asyncio; one ApiClient, closed by :meth:`close`."""

    def __init__(self, configuration: client.Configuration, *, component: str, instance: str) -> None:
        self._api = client.ApiClient(configuration)
        self._custom = client.CustomObjectsApi(self._api)
        self._core = client.CoreV1Api(self._api)
        self._component = component
        self._instance = instance[:128]

    async def close(self) -> None:
        await self._api.close()

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> WriteOutcome:
        try:
            await self._custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                {"status": status},
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return WriteOutcome.GONE
            raise StatusWriteError(
                f"PATCH {plural}/{namespace}/{name}/status: {exc.status} {exc.reason}",
                transient=api_error_is_transient(exc),
            ) from exc
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            raise StatusWriteError(
                f"PATCH {plural}/{namespace}/{name}/status: {type(exc).__name__}: {exc}",
                transient=api_error_is_transient(exc),
            ) from exc
        return WriteOutcome.WRITTEN

    async def post_event(self, ref: ObjectRef, *, type_: str, reason: str, message: str) -> None:
        now = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            # An explicit unique name (as client-go's recorder does) rather than generateName: one round trip.
            "metadata": {"name": f"{ref.name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": ref.kind,
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": ref.uid,
            },
            "reason": reason[:128],
            "message": message[:1024],
            "type": type_,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._core.create_namespaced_event(ref.namespace, body)  # type: ignore[arg-type]
        except ApiException as exc:
            raise StatusWriteError(
                f"POST event for {ref.kind}/{ref.name}: {exc.status} {exc.reason}",
                transient=api_error_is_transient(exc),
            ) from exc
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            raise StatusWriteError(
                f"POST event for {ref.kind}/{ref.name}: {type(exc).__name__}", transient=api_error_is_transient(exc)
            ) from exc

    async def list_objects(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        builtin = kinds.BUILTIN_KINDS.get(plural)
        if builtin is not None:
            return await self._list_builtin(builtin, namespace)
        if namespace is None:
            response = await self._custom.list_cluster_custom_object(GROUP, VERSION, plural)
        else:
            response = await self._custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
        items: list[dict[str, Any]] = response.get("items", [])
        return items

    async def _list_builtin(self, names: kinds.BuiltinKind, namespace: str | None) -> list[dict[str, Any]]:
        """List a built-in kind as plain dicts (the shape watch events have), not generated models."""
        call: Callable[..., Awaitable[Any]]
        if names is kinds.POD:
            call = self._core.list_namespaced_pod if namespace else self._core.list_pod_for_all_namespaces
        else:
            discovery = client.DiscoveryV1Api(self._api)
            call = (
                discovery.list_namespaced_endpoint_slice
                if namespace
                else discovery.list_endpoint_slice_for_all_namespaces
            )
        args = (namespace,) if namespace else ()
        response: Any = await call(*args, _preload_content=False)  # the raw response: JSON as watch events carry it
        try:
            body = json.loads(await response.read())
        finally:
            response.release()
        items: list[dict[str, Any]] = body.get("items") or []
        return items
