"""The runtime's environment client: run an episode on an environment server, fail in the taxonomy's terms.

- transport failures (refused, reset, cut-off body, client timeout) -> :class:`GymTransportError` (infra);
- a redirect (3xx) -> :class:`GymTransportError` naming the status and the Location's host: never followed;
- an episode failure the server calls retryable (admission, episode timeout, a sick dependency) -> infra
  (:class:`RolloutTimeout` for timeouts, else :class:`RolloutInfraFailure`);
- a terminal episode failure -> :class:`RolloutTerminalDataFailure` (the dispatcher stops at once);
- a 4xx without an episode reply (the request was refused) or a reply that fails validation ->
  :class:`RolloutDataFailure`; a 5xx/408/425/429 without one -> :class:`GymTransportError`;
- ``episode_in_progress`` (409: a previous attempt of the same ``episode_id`` is still live there) is infra
  whichever way it arrives: as a non-terminal episode failure (what the base server sends) or as a bare error.

Every failure leaves :meth:`EnvironmentClient.run_episode` already converted by
:func:`rollout_runtime.failures.to_picklable_failure`, so it may cross a Ray actor or process boundary as is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self, TypeVar, overload

import aiohttp
from pydantic import BaseModel, ValidationError

from rollout_runtime.environment.checkpoint.state import CheckpointManifest
from rollout_runtime.environment.episode_failure import (
    ADMISSION_TIMEOUT,
    EPISODE_IN_PROGRESS,
    EPISODE_TIMEOUT,
    EpisodeFailure,
)
from rollout_runtime.environment.failures import bound_reason
from rollout_runtime.environment.protocol import EpisodeResponse
from rollout_runtime.failures import (
    GymTransportError,
    RolloutDataFailure,
    RolloutFailure,
    RolloutInfraFailure,
    RolloutTerminalDataFailure,
    RolloutTimeout,
    http_status_is_infra,
    to_picklable_failure,
)
from rollout_runtime.redaction import redact_url, redirect_message, safe_message

__all__ = ["EnvironmentClient", "rollout_failure_for_episode", "rollout_failure_for_http_error"]

R = TypeVar("R", bound=EpisodeResponse)

_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)
_TIMEOUT_KINDS = frozenset({EPISODE_TIMEOUT, ADMISSION_TIMEOUT})


def rollout_failure_for_episode(failure: EpisodeFailure, *, status: int | None = None) -> RolloutFailure:
    """Map an episode failure reply onto the taxonomy: terminal -> data (no retry), otherwise infra."""
    message = bound_reason(f"environment episode failed at stage {failure.stage!r} ({failure.kind}): {failure.reason}")
    if failure.terminal:
        return RolloutTerminalDataFailure(message, status=status)
    if failure.kind in _TIMEOUT_KINDS:
        return RolloutTimeout(message, status=status)
    return RolloutInfraFailure(message, status=status)


def rollout_failure_for_http_error(status: int, body: str) -> RolloutFailure:
    """Map an HTTP error without an episode reply by its status, via the one retriable-status table.

    The one exception is the refusal of a duplicate attempt (error code ``episode_in_progress``): the request is
    fine, the previous attempt is just still live, so it is infra whatever its status.
    """
    reason = _error_message(body)
    if http_status_is_infra(status) or _error_code(body) == EPISODE_IN_PROGRESS:
        return GymTransportError(bound_reason(f"environment server answered HTTP {status}: {reason}"), status=status)
    return RolloutDataFailure(
        bound_reason(f"environment server refused the episode request (HTTP {status}): {reason}"), status=status
    )


def _error_code(body: str) -> str | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _error_message(body: str) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        return body.strip()[:500] or "(empty body)"
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return body.strip()[:500]
    details = error.get("details")
    if isinstance(details, list) and details:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in details[:5] if isinstance(d, dict)
        )
        return f"{error['message']}: {fields}"
    return str(error["message"])


class EnvironmentClient:
    """HTTP client of one environment server (``base_url``). Use as an async context manager or ``aclose()``."""

    def __init__(
        self,
        base_url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout_seconds: float | None = None,
        connect_timeout_seconds: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._session = session
        self._owns_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds, sock_connect=connect_timeout_seconds)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    @overload
    async def run_episode(self, request: BaseModel | Mapping[str, Any]) -> EpisodeResponse: ...

    @overload
    async def run_episode(self, request: BaseModel | Mapping[str, Any], response_model: type[R]) -> R: ...

    async def run_episode(
        self, request: BaseModel | Mapping[str, Any], response_model: type[EpisodeResponse] = EpisodeResponse
    ) -> EpisodeResponse:
        """Run one episode; return its reply, or raise a picklable taxonomy failure (see the module docstring)."""
        try:
            return await self._run_episode(request, response_model)
        except Exception as exc:
            raise to_picklable_failure(exc) from None

    async def _run_episode(
        self, request: BaseModel | Mapping[str, Any], response_model: type[EpisodeResponse]
    ) -> EpisodeResponse:
        payload = request.model_dump(mode="json") if isinstance(request, BaseModel) else dict(request)
        status, text = await self._call("POST", "/run", payload)
        try:
            body = json.loads(text)
        except ValueError:
            if status >= 400:
                raise rollout_failure_for_http_error(status, text) from None
            raise RolloutDataFailure(f"environment server replied HTTP {status} with a non-JSON body") from None
        failure = body.get("failure") if isinstance(body, dict) else None
        if failure is not None:
            try:
                parsed = EpisodeFailure.model_validate(failure)
            except ValidationError as exc:
                raise RolloutDataFailure(
                    f"environment server sent a malformed failure: {exc.error_count()} error(s)"
                ) from None
            raise rollout_failure_for_episode(parsed, status=status if status >= 400 else None)
        if status >= 400:
            raise rollout_failure_for_http_error(status, text)
        try:
            return response_model.model_validate(body)
        except ValidationError as exc:
            raise RolloutDataFailure(
                bound_reason(f"environment reply does not match {response_model.__name__}: {exc}")
            ) from None

    async def health(self) -> dict[str, Any]:
        """The server's ``/health`` body, also while draining (503); :class:`GymTransportError` if unreachable."""
        status, text = await self._call("GET", "/health", None)
        if status not in (200, 503):
            raise to_picklable_failure(rollout_failure_for_http_error(status, text))
        result: dict[str, Any] = json.loads(text)
        return result

    async def begin_checkpoint(self) -> None:
        """Open a checkpoint and return at once (episodes park from their next boundary on)."""
        await self._checked("POST", "/checkpoint/open?wait=false")

    async def open_checkpoint(self) -> CheckpointManifest:
        """Open a checkpoint (or join the open one); returns once every episode is parked and exported."""
        _, text = await self._checked("POST", "/checkpoint/open")
        return CheckpointManifest.model_validate_json(text)

    async def resume_checkpoint(self) -> bool:
        """Release parked episodes; returns whether a checkpoint was open."""
        _, text = await self._checked("POST", "/checkpoint/resume")
        return bool(json.loads(text).get("resumed"))

    async def _checked(self, method: str, path: str) -> tuple[int, str]:
        status, text = await self._call(method, path, None)
        if status >= 400:
            raise to_picklable_failure(rollout_failure_for_http_error(status, text))
        return status, text

    async def _call(self, method: str, path: str, payload: Any) -> tuple[int, str]:
        url = f"{self.base_url}{path}"
        try:
            async with self._http().request(method, url, json=payload, allow_redirects=False) as response:
                if 300 <= response.status < 400:  # never followed: the episode request would go to another host
                    where = f"environment server {redact_url(self.base_url)}"
                    message = redirect_message(where, response.status, response.headers)
                    raise GymTransportError(message, status=response.status)
                return response.status, await response.text()
        except _TRANSPORT_ERRORS as exc:
            raise GymTransportError(
                safe_message(
                    f"environment server {self.base_url} failed at the transport layer: {type(exc).__name__}: {exc}"
                )
            ) from exc
