"""Where a shard's instance identity comes from: pluggable sources, each a pure parser plus one GET.

An identity is an opaque string; only a change matters (:meth:`HealthState.observe_instance`). What each source
reads, and why a change means "restarted with base weights":

- :class:`SGLangWeightVersion`: SGLang's ``GET /weight_version`` (older releases ``/get_weight_version``), JSON
  ``{"weight_version": ...}``. It is ``"default"`` (or the ``--weight-version`` flag) after a start and whatever
  the last ``update_weights_from_*`` / ``update_weight_version`` call set, so a restart shows as a change back.
- :class:`VllmWeightInfo`: vLLM's dev-mode (``VLLM_SERVER_DEV_MODE=1``) ``GET /weight_info``, JSON
  ``{"weight_version": ...}``, set by ``/finish_weight_update`` or ``/update_weight_version``; the routes vary
  across vLLM releases, so check the one you pin.
- :class:`ProcessStartTime`: ``process_start_time_seconds`` in the Prometheus text of ``GET /metrics`` (any server
  that exports prometheus-client's process collector, llama.cpp's and vLLM's single-process server among them):
  a new process has a new start time. vLLM in multiprocess mode may not export it.
- :class:`SuppliedIdentity`: a value the caller sets, e.g. the operator's pod identity ``"<uid>:<restarts>"``
  (a new pod UID or a container restart).
- :class:`OutageEpochs`: a probe outage long enough to mean the process died: each such outage starts a new epoch.

A fetch that fails returns None ("no evidence this time"), never raises: the probes judge reachability.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "DEFAULT_IDENTITY_TIMEOUT_SECONDS",
    "IdentitySource",
    "OutageEpochs",
    "ProcessStartTime",
    "SGLangWeightVersion",
    "SuppliedIdentity",
    "VllmWeightInfo",
    "parse_process_start_time",
    "parse_weight_version",
]

DEFAULT_IDENTITY_TIMEOUT_SECONDS: Final[float] = 2.0
_MAX_BODY_BYTES: Final[int] = 1024 * 1024
_MAX_IDENTITY_CHARS: Final[int] = 256


def parse_weight_version(body: Any) -> str | None:
    """``{"weight_version": v}`` (SGLang's and vLLM's shape) -> ``str(v)``; None for any other body."""
    if not isinstance(body, Mapping):
        return None
    version = body.get("weight_version")
    if version is None or isinstance(version, (dict, list, bool)):
        return None
    text = str(version)
    return text[:_MAX_IDENTITY_CHARS] if text else None


def parse_process_start_time(text: str) -> str | None:
    """The ``process_start_time_seconds`` sample of a Prometheus exposition, as a string; None if absent or
    unparsable (a malformed exposition is no evidence, not an error)."""
    try:
        for family in text_string_to_metric_families(text):
            if family.name != "process_start_time_seconds":
                continue
            for sample in family.samples:
                if sample.name == "process_start_time_seconds" and math.isfinite(sample.value):
                    return repr(float(sample.value))
    except (ValueError, TypeError, IndexError):
        return None
    return None


@runtime_checkable
class IdentitySource(Protocol):
    """Reads one shard's instance identity; None when it has no evidence this time."""

    async def identity(self, session: aiohttp.ClientSession, name: str, endpoint: str) -> str | None: ...


async def _get(session: aiohttp.ClientSession, url: str, seconds: float) -> tuple[int, bytes] | None:
    try:
        async with asyncio.timeout(seconds):
            async with session.get(url, allow_redirects=False) as response:
                body = await response.content.read(_MAX_BODY_BYTES + 1)
                if len(body) > _MAX_BODY_BYTES:
                    return None
                return response.status, body
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


@dataclass(frozen=True)
class SGLangWeightVersion:
    """SGLang's weight version: tries ``paths`` in order (new name first), the first 200 with a version wins."""

    paths: tuple[str, ...] = ("/weight_version", "/get_weight_version")
    timeout_seconds: float = DEFAULT_IDENTITY_TIMEOUT_SECONDS
    prefix: str = "weight_version:"

    async def identity(self, session: aiohttp.ClientSession, name: str, endpoint: str) -> str | None:
        for path in self.paths:
            got = await _get(session, endpoint + path, self.timeout_seconds)
            if got is None:
                return None  # unreachable: no evidence (and no point trying the other name)
            status, body = got
            if status == 200 and (version := parse_weight_version(_json(body))) is not None:
                return self.prefix + version
        return None


@dataclass(frozen=True)
class VllmWeightInfo:
    """vLLM's dev-mode ``GET /weight_info``."""

    path: str = "/weight_info"
    timeout_seconds: float = DEFAULT_IDENTITY_TIMEOUT_SECONDS
    prefix: str = "weight_version:"

    async def identity(self, session: aiohttp.ClientSession, name: str, endpoint: str) -> str | None:
        got = await _get(session, endpoint + self.path, self.timeout_seconds)
        if got is None or got[0] != 200:
            return None
        version = parse_weight_version(_json(got[1]))
        return None if version is None else self.prefix + version


@dataclass(frozen=True)
class ProcessStartTime:
    """``process_start_time_seconds`` from the shard's ``/metrics``."""

    path: str = "/metrics"
    timeout_seconds: float = DEFAULT_IDENTITY_TIMEOUT_SECONDS
    prefix: str = "process_start:"

    async def identity(self, session: aiohttp.ClientSession, name: str, endpoint: str) -> str | None:
        got = await _get(session, endpoint + self.path, self.timeout_seconds)
        if got is None or got[0] != 200:
            return None
        started = parse_process_start_time(got[1].decode("utf-8", errors="replace"))
        return None if started is None else self.prefix + started


@dataclass
class SuppliedIdentity:
    """Identities set by the caller (:meth:`set`), e.g. pod identities from Kubernetes discovery."""

    values: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, identity: str | None) -> None:
        if identity is None:
            self.values.pop(name, None)
        else:
            self.values[name] = identity

    async def identity(self, session: aiohttp.ClientSession, name: str, endpoint: str) -> str | None:
        return self.values.get(name)


class OutageEpochs:
    """A probe outage of at least ``dead_after_seconds`` means the process died: count such outages per shard.

    Pure: feed it probe outcomes with :meth:`observe`; :meth:`identity_of` is ``"outage_epoch:<n>"``. For servers
    that expose nothing better; a short blip (below the bound) keeps the epoch.
    """

    def __init__(
        self,
        dead_after_seconds: float,
        *,
        path: str = "/health",
        timeout_seconds: float = DEFAULT_IDENTITY_TIMEOUT_SECONDS,
    ) -> None:
        if not dead_after_seconds > 0:
            raise ValueError(f"dead_after_seconds must be > 0, got {dead_after_seconds}")
        self.dead_after_seconds = dead_after_seconds
        self.path = path
        self.timeout_seconds = timeout_seconds
        self._epoch: dict[str, int] = {}
        self._down_since: dict[str, float] = {}

    def observe(self, name: str, ok: bool, now: float) -> str:
        """Record one probe outcome at ``now``; return the shard's identity after it."""
        epoch = self._epoch.setdefault(name, 0)
        if not ok:
            self._down_since.setdefault(name, now)
        else:
            since = self._down_since.pop(name, None)
            if since is not None and now - since >= self.dead_after_seconds:
                epoch = self._epoch[name] = epoch + 1
        return f"outage_epoch:{epoch}"

    def identity_of(self, name: str) -> str:
        return f"outage_epoch:{self._epoch.get(name, 0)}"

    async def identity(self, session: aiohttp.ClientSession, name: str, endpoint: str) -> str | None:
        """GET ``path`` once (a 2xx is up, anything else down) and return the epoch after it."""
        got = await _get(session, endpoint + self.path, self.timeout_seconds)
        ok = got is not None and 200 <= got[0] < 300
        return self.observe(name, ok, asyncio.get_running_loop().time())
