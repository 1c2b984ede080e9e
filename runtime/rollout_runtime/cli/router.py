"""``rollout-fleet router``: serve the OpenAI-compatible router (see :mod:`rollout_runtime.router`).

Two shard sources: ``--shard URL`` (repeatable; the router probes them itself, no Kubernetes) or ``--fleet NAME
--namespace NS`` (follow a RolloutFleet's status, as the operator publishes it). On startup it prints one
machine-readable line, ``ROUTER_READY {"host": ..., "port": ..., "pid": ..., "event_loop": ...}``, so a parent can pass
``--port 0`` (``event_loop``: the loop's module, ``uvloop`` or ``asyncio.unix_events``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from rollout_runtime.cli.options import (
    DEFAULT_EVENT_LOOP,
    EVENT_LOOPS,
    EXIT_WITH_PARENT,
    HOST,
    PORT_NUMBER,
    command_help,
    config_from_options,
    log_level,
    serve_until_stopped,
)
from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.health.hysteresis import ProbeSettings
from rollout_runtime.router import READY_PREFIX, Router, RouterConfig, serve_router
from rollout_runtime.router.config import ROUTER_SETTINGS
from rollout_runtime.shards.model import Shard, ShardSource

F = TypeVar("F", bound=Callable[..., Any])

_DETAILS = (
    "Point environment and agent servers at http://HOST:PORT/v1 (NeMo-Gym's policy_base_url). With no routable "
    "shard the router answers 409 with a JSON reason (clients do not retry 409 forever as they do 503)."
)


def setting_flag(name: str) -> str:
    """A router setting's option: the field's name in kebab case, without a ``_seconds`` suffix (the help says)."""
    return "--" + name.removesuffix("_seconds").replace("_", "-")


def _option_type(info: FieldInfo) -> click.IntRange | click.FloatRange | click.types.StringParamType:
    """The option's type, with the field's bounds (shown in ``--help``; the model still validates the value)."""
    bounds = {key: getattr(m, key) for m in info.metadata for key in ("ge", "gt", "le", "lt") if hasattr(m, key)}
    low, high = bounds.get("ge", bounds.get("gt")), bounds.get("le", bounds.get("lt"))
    if info.annotation is int:
        return click.IntRange(low, high, min_open="gt" in bounds, max_open="lt" in bounds)
    if info.annotation is float:
        return click.FloatRange(low, high, min_open="gt" in bounds, max_open="lt" in bounds)
    return click.STRING


def setting_options(command: F) -> F:
    """One option per :data:`ROUTER_SETTINGS` field, named, typed, defaulted and described by the model."""
    for name in reversed(ROUTER_SETTINGS):
        info = RouterConfig.model_fields[name]
        help_text = " ".join((info.description or "").split())
        option = click.option(
            setting_flag(name), name, type=_option_type(info), default=info.default, show_default=True, help=help_text
        )
        command = option(command)
    return command


def shards_from_urls(urls: tuple[str, ...]) -> list[Shard]:
    """``--shard`` values (``URL`` or ``NAME=URL``) as shards, named by host:port unless named. Pure."""
    shards = []
    for value in urls:
        name, sep, url = value.partition("=")
        if not sep or "://" in name:
            name, url = "", value
        try:
            parts = urlsplit(url)
            shards.append(Shard(name=name or parts.netloc or url, endpoint=url))
        except (ValidationError, ValueError) as exc:
            raise click.BadParameter(f"{value!r} is not an http(s) URL of a shard ({exc.__class__.__name__})") from None
    names = [s.name for s in shards]
    if len(set(names)) != len(names):
        raise click.BadParameter(f"shard names must be unique, got {names}; name them as NAME=URL")
    return shards


@click.command("router", help=command_help("router", _DETAILS))
@HOST
@click.option("--port", type=PORT_NUMBER, default=8000, show_default=True, help="0: the kernel picks a free port.")
@click.option("--shard", "shard_urls", multiple=True, help="A shard's base URL, or NAME=URL (repeatable).")
@click.option("--fleet", default=None, help="Follow this RolloutFleet's healthy shards instead of --shard.")
@click.option("--namespace", "-n", default="default", show_default=True, help="The RolloutFleet's namespace.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None)
@setting_options
@click.option(
    "--probe-period",
    type=click.FloatRange(min=0.05),
    default=None,
    help="Seconds between probes of each --shard (default: the probes' own); each probe times out at 0.8 of it.",
)
@click.option(
    "--event-loop",
    type=click.Choice(EVENT_LOOPS),
    default=DEFAULT_EVENT_LOOP,
    show_default=True,
    help="uvloop (libuv) spends less CPU per relayed request than asyncio's own loop.",
)
@EXIT_WITH_PARENT
@log_level("INFO")
def router(
    host: str,
    port: int,
    shard_urls: tuple[str, ...],
    fleet: str | None,
    namespace: str,
    kubeconfig: Path | None,
    probe_period: float | None,
    event_loop: str,
    exit_with_parent: bool,
    log_level: str,
    **router_settings: Any,
) -> None:
    if bool(shard_urls) == bool(fleet):
        raise click.UsageError("give either --shard URL (repeatable) or --fleet NAME, not both and not neither")
    config = config_from_options(RouterConfig, **router_settings)
    source: ShardSource
    if fleet:
        from rollout_runtime.shards.kubernetes import KubernetesShardSource

        source = KubernetesShardSource(fleet, namespace=namespace, kubeconfig=kubeconfig)
    else:
        from rollout_runtime.shards.local import LocalShardSource

        settings = ProbeSettings()
        if probe_period is not None:
            timeout = min(settings.timeout_seconds, 0.8 * probe_period)
            settings = config_from_options(ProbeSettings, period_seconds=probe_period, timeout_seconds=timeout)
        source = LocalShardSource(shards_from_urls(shard_urls), settings)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_until_stopped(_serve(source, config, host, port, exit_with_parent=exit_with_parent), host, port, event_loop)


async def serving_config(source: ShardSource, config: RouterConfig) -> RouterConfig:
    """The config the router serves with: a router that follows a RolloutFleet (a source with ``dispatch_policy``,
    :class:`~rollout_runtime.shards.KubernetesShardSource`) takes that fleet's ``spec.policy`` under its own settings
    (:meth:`RouterConfig.dispatch_policy`); a fleet that does not exist is a clean error, not a traceback."""
    fleet_policy: Callable[[], Awaitable[DispatchPolicy]] | None = getattr(source, "dispatch_policy", None)
    if fleet_policy is None:
        return config
    try:
        return config.following(await fleet_policy())
    except (LookupError, ValueError) as exc:
        raise click.ClickException(f"{exc}: the router follows that RolloutFleet's spec.policy") from None


async def _serve(source: ShardSource, config: RouterConfig, host: str, port: int, *, exit_with_parent: bool) -> None:
    config = await serving_config(source, config)
    parent = os.getppid()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with Router(source, config) as routing, serve_router(routing, host=host, port=port) as server:
        ready = {"host": host, "port": server.port, "pid": os.getpid(), "event_loop": type(loop).__module__}
        sys.stdout.write(READY_PREFIX + json.dumps(ready) + "\n")
        sys.stdout.flush()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            except TimeoutError:
                if exit_with_parent and os.getppid() != parent:
                    break


if __name__ == "__main__":
    router()
