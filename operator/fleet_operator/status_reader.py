"""The I/O of ``rollout-fleet status``: read fleets and their members from the API server, once or on a watch.

Every round of reads is bounded by ``--timeout``: an API server that does not answer (or refuses the connection)
is :class:`ApiServerUnreachable`, "cannot reach the API server at <url>: <reason>", not a hang and a traceback. What
is shown is built by :mod:`fleet_operator.status_table` from what is read here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import click
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from fleet_operator.status_table import fleet_summary
from rollout_runtime.cli.errors import describe_error
from rollout_runtime.kube import kinds
from rollout_runtime.kube.config import default_kubeconfig_paths, load_client_configuration
from rollout_runtime.kube.errors import api_error_is_transient
from rollout_runtime.kube.kinds import GROUP, VERSION

__all__ = ["ApiServerUnreachable", "FleetNotFound", "FleetQuery", "StatusReader", "open_reader", "watch_changes"]


class ApiServerUnreachable(ConnectionError):
    """No answer from the API server within the timeout, or no connection to it at all."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the API server at {url}: {reason}")


class FleetNotFound(click.ClickException):
    """The named RolloutFleet does not exist in the namespace (exit 1, like ``kubectl get`` of a missing object)."""


@dataclass(frozen=True, slots=True)
class FleetQuery:
    """Which fleets to show: one by name, every fleet in ``namespace`` (None: the kubeconfig's), or all namespaces."""

    name: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False


def _kubeconfig_namespace(kubeconfig: Path | None) -> str:
    """The current context's namespace, else "default" (kubectl's rule)."""
    if kubeconfig is None and not any(p.is_file() for p in default_kubeconfig_paths()):
        return "default"  # in a pod without a kubeconfig
    try:
        _, context = config.list_kube_config_contexts(config_file=str(kubeconfig) if kubeconfig else None)
    except config.ConfigException:
        return "default"
    return str(((context or {}).get("context") or {}).get("namespace") or "default")


async def _retrying(make: Callable[[], Awaitable[Any]], *, attempts: int = 8) -> Any:
    """Make an API call; on a transient answer (429 while a new CRD's storage initialises, 5xx), make it again after
    the pause the server asks for (Retry-After, at most 10 s). The caller's timeout bounds the whole."""
    for attempt in range(attempts):
        try:
            return await make()
        except ApiException as exc:
            if attempt == attempts - 1 or not api_error_is_transient(exc):
                raise
            headers: Mapping[str, str] = exc.headers or {}
            retry_after = str(headers.get("Retry-After", "1"))
            await asyncio.sleep(min(10.0, float(retry_after) if retry_after.isdigit() else 1.0))
    raise AssertionError("unreachable")


class StatusReader:
    """Reads the summaries a :class:`FleetQuery` asks for, each round within ``timeout`` seconds."""

    def __init__(self, api: client.ApiClient, url: str, query: FleetQuery, namespace: str, timeout: float) -> None:
        self._api = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._discovery = client.DiscoveryV1Api(api)
        self.url = url
        self.query = query
        self.namespace = namespace
        self.timeout = timeout

    async def read(self) -> list[dict[str, Any]]:
        """The fleets' summaries, sorted by namespace and name; FleetNotFound, ApiServerUnreachable, ApiException."""
        try:
            async with asyncio.timeout(self.timeout):
                return await self._read()
        except TimeoutError:
            raise ApiServerUnreachable(self.url, f"no answer within {self.timeout:g} s (--timeout)") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ApiServerUnreachable(self.url, " ".join(str(exc).split()) or type(exc).__name__) from exc

    async def _list(self, plural: str) -> list[dict[str, Any]]:
        api, timeout = self._api, self.timeout
        try:
            if self.query.all_namespaces:
                listed = await _retrying(
                    lambda: api.list_cluster_custom_object(GROUP, VERSION, plural, _request_timeout=timeout)
                )
            else:
                listed = await _retrying(
                    lambda: api.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, plural, _request_timeout=timeout
                    )
                )
        except ApiException as exc:
            if exc.status == 404:  # a list is only missing when its kind is
                raise click.ClickException(
                    f"{plural}.{GROUP} is not installed on {self.url}: apply the CRDs (`rollout-fleet crds`)"
                ) from None
            raise
        return list(listed.get("items", []))

    async def _list_raw(self, namespaced: Callable[..., Awaitable[Any]], cluster: Callable[..., Awaitable[Any]]) -> Any:
        """A built-in kind's list as the API's JSON (camelCase, what fleet_operator.discovery reads)."""
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout}

        async def listed() -> Any:
            if self.query.all_namespaces:
                response = await cluster(**options)
            else:
                response = await namespaced(self.namespace, **options)
            try:
                if not 200 <= response.status <= 299:  # unread responses are not checked by the client
                    raise ApiException(status=response.status, reason=response.reason)
                return json.loads(await response.read())
            finally:
                response.release()

        return list((await _retrying(listed)).get("items") or [])

    async def _pods_and_slices(self, fleets: list[dict[str, Any]]) -> tuple[list[dict[str, Any]] | None, list[Any]]:
        """The pods and EndpointSlices pod members come from, read only when a fleet selects pods; pods None when
        the caller may not list them (the summary then shows the published pod members only)."""
        selections = [
            selection
            for fleet in fleets
            for key in ("shardPods", "environmentServerPods")
            if isinstance(selection := (fleet.get("spec") or {}).get(key), dict)
        ]
        if not selections:
            return [], []
        try:
            pods = await self._list_raw(self._core.list_namespaced_pod, self._core.list_pod_for_all_namespaces)
            slices: list[Any] = []
            if any(selection.get("service") for selection in selections):
                slices = await self._list_raw(
                    self._discovery.list_namespaced_endpoint_slice,
                    self._discovery.list_endpoint_slice_for_all_namespaces,
                )
        except ApiException as exc:
            if exc.status == 403:
                return None, []
            raise
        return pods, slices

    async def _read(self) -> list[dict[str, Any]]:
        name = self.query.name
        if name is not None:
            try:
                fleets = [
                    await _retrying(
                        lambda: self._api.get_namespaced_custom_object(
                            GROUP,
                            VERSION,
                            self.namespace,
                            kinds.ROLLOUT_FLEET.plural,
                            name,
                            _request_timeout=self.timeout,
                        )
                    )
                ]
            except ApiException as exc:
                if exc.status == 404:
                    raise FleetNotFound(f"RolloutFleet {self.namespace}/{name} not found") from None
                raise
        else:
            fleets = await self._list(kinds.ROLLOUT_FLEET.plural)
        if not fleets:
            return []
        shards = await self._list(kinds.GENERATION_SHARD.plural)
        environments = await self._list(kinds.ENVIRONMENT_SERVER.plural)
        pods, slices = await self._pods_and_slices(fleets)
        summaries = [fleet_summary(f, shards, environments, pods, slices) for f in fleets]
        return sorted(summaries, key=lambda s: (str(s["namespace"]), str(s["name"])))


@asynccontextmanager
async def open_reader(
    query: FleetQuery, *, kubeconfig: Path | None, read_timeout: float
) -> AsyncIterator[StatusReader]:
    """A reader on the API server the kubeconfig (or the pod's service account) names; ``read_timeout`` bounds
    each of its reads."""
    configuration = await load_client_configuration(kubeconfig)
    namespace = query.namespace or _kubeconfig_namespace(kubeconfig)
    async with client.ApiClient(configuration) as api:
        yield StatusReader(api, str(configuration.host), query, namespace, read_timeout)


async def watch_changes(
    reader: StatusReader, *, interval: float, max_updates: int | None, warn: Callable[[str], None]
) -> AsyncIterator[list[dict[str, Any]]]:
    """The summaries each time they differ from the last ones yielded, read every ``interval`` seconds; at most
    ``max_updates`` of them (None: until interrupted). After the first read, an API server that cannot be reached
    for a while is a warning (through ``warn``) and the watch goes on; the first read's errors are the caller's."""
    last: str | None = None
    updates = 0
    while max_updates is None or updates < max_updates:
        try:
            summaries = await reader.read()
        except (ApiServerUnreachable, ApiException) as exc:
            if last is None or (isinstance(exc, ApiException) and not api_error_is_transient(exc)):
                raise
            warn(f"{describe_error(exc) or type(exc).__name__}; retrying")
        else:
            key = json.dumps(summaries, sort_keys=True, default=str)
            if key != last:
                last = key
                updates += 1
                yield summaries
                if max_updates is not None and updates >= max_updates:
                    return
        await asyncio.sleep(interval)
