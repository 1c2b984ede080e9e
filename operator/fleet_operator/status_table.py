"""``rollout-fleet status FLEET``: a RolloutFleet's health as a rich table, read from the API server.

The table is built by a pure function from the objects (so it is testable without a cluster); the command only
fetches them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from fleet_operator.decisions import selector_matches
from fleet_operator.models import LabelSelector, RolloutFleetSpec, RolloutFleetStatus
from rollout_runtime.kube import kinds
from rollout_runtime.kube.config import load_client_configuration
from rollout_runtime.kube.errors import api_error_is_transient
from rollout_runtime.kube.kinds import GROUP, VERSION

__all__ = ["fleet_table", "show_fleet_status"]

_PHASE_STYLE = {"Healthy": "green", "Suspect": "yellow", "Unhealthy": "red", "Draining": "blue", "Pending": "dim"}


def _selected(items: Iterable[Mapping[str, Any]], selector: LabelSelector | None) -> list[Mapping[str, Any]]:
    if selector is None:
        return []
    return [i for i in items if selector_matches(selector, (i.get("metadata") or {}).get("labels") or {})]


def fleet_table(
    fleet: Mapping[str, Any], shards: Iterable[Mapping[str, Any]], environments: Iterable[Mapping[str, Any]]
) -> Group:
    """The renderable for one fleet and the members it selects."""
    name = (fleet.get("metadata") or {}).get("name", "?")
    try:
        spec: RolloutFleetSpec | None = RolloutFleetSpec.model_validate(fleet.get("spec") or {})
    except ValidationError:
        spec = None
    status = RolloutFleetStatus.model_validate(fleet.get("status") or {})
    in_set = {e.name for e in status.shards} | {e.name for e in status.environment_servers}
    conditions = ", ".join(f"{c.type}={c.status} ({c.reason})" for c in status.conditions) or "none yet"
    header = Text.assemble(
        ("RolloutFleet ", "bold"),
        (str(name), "bold cyan"),
        f"  healthy {status.healthy}  environments {status.ready_environment_servers}/"
        f"{status.total_environment_servers}  revision {status.revision or '-'}\n",
        f"conditions: {conditions}\nlast heartbeat: {status.last_heartbeat_time or 'never'}",
    )
    table = Table(show_lines=False)
    for column in ("Kind", "Name", "Phase", "In set", "Endpoint", "Latency ms", "Last error"):
        table.add_column(column, overflow="fold")
    shard_selector = spec.shard_selector if spec else None
    environment_selector = spec.environment_server_selector if spec else None
    members = [(kinds.GENERATION_SHARD.kind, s) for s in _selected(shards, shard_selector)] + [
        (kinds.ENVIRONMENT_SERVER.kind, e) for e in _selected(environments, environment_selector)
    ]
    for kind, obj in sorted(members, key=lambda m: (m[0], (m[1].get("metadata") or {}).get("name", ""))):
        member_status = obj.get("status") or {}
        phase = str(member_status.get("phase") or "Pending")
        member_name = (obj.get("metadata") or {}).get("name", "?")
        latency = member_status.get("latencyMilliseconds")
        table.add_row(
            kind,
            member_name,
            Text(phase, style=_PHASE_STYLE.get(phase, "")),
            "yes" if member_name in in_set else "no",
            str(member_status.get("endpoint") or "-"),
            f"{latency:.1f}" if isinstance(latency, int | float) else "-",
            str(member_status.get("lastError") or ""),
        )
    return Group(header, table)


async def _retrying(make: Callable[[], Awaitable[Any]], *, attempts: int = 8) -> Any:
    """Make an API call; on a transient answer (429 while a new CRD's storage initialises, 5xx), make it again after
    the pause the server asks for (Retry-After, at most 10 s)."""
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


async def show_fleet_status(fleet: str, *, namespace: str | None, kubeconfig: Path | None) -> int:
    """Fetch the fleet and its members, print the table; the exit code (1: fleet not found)."""
    configuration = await load_client_configuration(kubeconfig)
    if namespace is None:
        try:
            _, context = config.list_kube_config_contexts(config_file=str(kubeconfig) if kubeconfig else None)
            namespace = ((context or {}).get("context") or {}).get("namespace") or "default"
        except config.ConfigException:
            namespace = "default"
    console = Console()
    async with client.ApiClient(configuration) as api_client:
        api = client.CustomObjectsApi(api_client)
        try:
            obj = await _retrying(
                lambda: api.get_namespaced_custom_object(GROUP, VERSION, namespace, kinds.ROLLOUT_FLEET.plural, fleet)
            )
        except ApiException as exc:
            if exc.status == 404:
                console.print(f"[red]RolloutFleet {namespace}/{fleet} not found[/red]")
                return 1
            raise
        shards = await _retrying(
            lambda: api.list_namespaced_custom_object(GROUP, VERSION, namespace, kinds.GENERATION_SHARD.plural)
        )
        environments = await _retrying(
            lambda: api.list_namespaced_custom_object(GROUP, VERSION, namespace, kinds.ENVIRONMENT_SERVER.plural)
        )
    console.print(fleet_table(obj, shards.get("items", []), environments.get("items", [])))
    return 0
