"""The shared lifecycle every environment server inherits: a typed episode protocol with limits and cleanup.

A concrete server subclasses :class:`BaseEnvironmentServer` with its request/response models and implements
:meth:`~BaseEnvironmentServer.run_episode`. Every episode then goes through the same path
(:meth:`~BaseEnvironmentServer.serve_episode`): admission (bounded queue, timed), tracking, checkpoint continuation,
the episode deadline (parked time excluded), failure adaptation, LIFO cleanup, metrics. Episode replies are 200
when the episode ran (succeeded or failed), 503 when it was never admitted or the checkpoint store failed, 409
(non-terminal) when another attempt of the same ``episode_id`` is still live, 4xx when the request itself is bad.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from rollout_runtime.environment.aggregation import RolloutScore, TaskMetrics, aggregate_rollout_scores
from rollout_runtime.environment.attempts import Attempt, EpisodeAttempts, EpisodeInProgress
from rollout_runtime.environment.checkpoint import (
    CheckpointAborted,
    CheckpointCoordinator,
    CheckpointingOff,
    CheckpointMismatch,
    CheckpointStore,
    CheckpointStoreError,
    CorruptCheckpointError,
    EpisodeSteps,
    FilesystemCheckpointStore,
    input_digest,
)
from rollout_runtime.environment.cleanup import EpisodeCleanupContext
from rollout_runtime.environment.config import EnvironmentServerConfig
from rollout_runtime.environment.episode import EpisodeContext
from rollout_runtime.environment.episode_failure import (
    ADMISSION_REJECTED,
    ADMISSION_TIMEOUT,
    EPISODE_IN_PROGRESS,
    EPISODE_TIMEOUT,
    HandledEpisodeFailure,
    handled_episode_failure,
    unhandled_episode_failure,
)
from rollout_runtime.environment.http import (
    RequestRejected,
    error_response,
    json_errors_middleware,
    read_json_body,
    validation_rejection,
)
from rollout_runtime.environment.limits import AdmissionLimiter, AdmissionRejected
from rollout_runtime.environment.metrics import EnvironmentMetrics, EpisodeOutcome
from rollout_runtime.environment.protocol import EpisodeRequest, EpisodeResponse

__all__ = [
    "BaseEnvironmentServer",
    "EpisodeResult",
    "RunningServer",
    "setup_environment_app",
]

log = logging.getLogger(__name__)

EpisodeRequestT = TypeVar("EpisodeRequestT", bound=EpisodeRequest)
EpisodeResponseT = TypeVar("EpisodeResponseT", bound=EpisodeResponse)

SERVER_KEY: web.AppKey[BaseEnvironmentServer[Any, Any]] = web.AppKey("environment_server")
CHECKPOINT_REJECTED = "checkpoint_rejected"
CHECKPOINT_STORE_FAILED = "checkpoint_store_failed"
"""The checkpoint store failed (an OSError): a non-terminal failure, replied with 503."""
EPISODE_IN_PROGRESS_STATUS = 409
"""A conflict with the live attempt, not a sick server; the reply's failure is non-terminal, so the runtime's
client retries it as infra (by the failure, not the status)."""


@dataclass(frozen=True)
class EpisodeResult:
    """An episode's reply, the HTTP status it goes out with, and its metrics outcome."""

    response: EpisodeResponse
    http_status: int
    outcome: EpisodeOutcome


@dataclass
class RunningServer:
    """A started server: where it listens and how to stop it."""

    url: str
    port: int
    runner: web.AppRunner

    async def stop(self) -> None:
        await self.runner.cleanup()


class _AggregateRequest(BaseModel):
    rollouts: list[RolloutScore]
    success_threshold: float = 1.0


class BaseEnvironmentServer(abc.ABC, Generic[EpisodeRequestT, EpisodeResponseT]):
    """Expose a typed episode protocol with shared limits and cleanup.

    Subclasses set ``request_model``, ``response_model`` and ``protocol_name`` and implement :meth:`run_episode`.
    ``checkpoint_mode = "exported"`` (a protocol that records boundaries) continues after a restore; the episodes of
    a ``"restart"`` protocol (records none) never hold up a checkpoint and start over from their input after a crash.
    """

    protocol_name: ClassVar[str] = "episode"
    checkpoint_mode: ClassVar[Literal["exported", "restart"]] = "exported"
    request_model: type[EpisodeRequestT]
    response_model: type[EpisodeResponseT]

    def __init__(
        self,
        config: EnvironmentServerConfig | None = None,
        *,
        metrics: EnvironmentMetrics | None = None,
        checkpoint_store: CheckpointStore | None = None,
    ) -> None:
        self.config = config or EnvironmentServerConfig()
        self.metrics = metrics or EnvironmentMetrics()
        if checkpoint_store is None and self.config.checkpoint_dir is not None:
            checkpoint_store = FilesystemCheckpointStore(self.config.checkpoint_dir)
        self.checkpoints = CheckpointCoordinator(
            checkpoint_store, protocol=self.protocol_name, on_store_failure=self.metrics.checkpoint_store_failed
        )
        self.attempts: EpisodeAttempts[EpisodeResult] = EpisodeAttempts(capacity=self.config.remembered_episodes)
        self.limiter = AdmissionLimiter(
            self.config.max_concurrent_episodes,
            max_queued=self.config.max_queued_episodes,
            timeout_seconds=self.config.admission_timeout_seconds,
        )
        self.episodes: set[EpisodeContext] = set()
        self.draining = False
        self.metrics.episodes_in_flight.set_function(lambda: len(self.episodes))
        self.metrics.admission_queue_depth.set_function(lambda: self.limiter.queued)
        self.metrics.attempts_waiting.set_function(lambda: self.attempts.waiting)

    # -- the protocol a concrete server implements -------------------------------------------------------------

    @abc.abstractmethod
    async def run_episode(self, request: EpisodeRequestT, episode: EpisodeContext) -> EpisodeResponseT:
        """Run one concrete environment protocol. Raise a handled episode failure to fail it deliberately."""

    def episode_timeout_seconds(self, request: EpisodeRequestT) -> float | None:
        """The wall-clock bound of this episode: ``default_episode_timeout_seconds`` (None is no bound).

        A protocol whose tasks carry their own budgets may derive a longer one per episode. It must never raise
        here, as nothing of the episode has started yet; if it does, the episode fails terminally, loudly.
        """
        return self.config.default_episode_timeout_seconds

    def failure_response(self, request: EpisodeRequestT, failure: HandledEpisodeFailure) -> EpisodeResponse:
        """Adapt runtime event, local policy and evidence to the protocol's wire failure model.

        Called after cleanup. The default puts the wire failure in ``failure`` and the :class:`FailureReport`
        beside it in ``failure_report``.
        """
        return EpisodeResponse(
            episode_id=request.episode_id, failure=failure.wire_failure(), failure_report=failure.report()
        )

    def aggregate_metrics(self, rollouts: list[RolloutScore], *, success_threshold: float) -> dict[str, TaskMetrics]:
        """Aggregate per-rollout scores into task-level metrics (override for protocol-specific metrics)."""
        return aggregate_rollout_scores(rollouts, success_threshold=success_threshold)

    # -- the lifecycle every episode goes through -----------------------------------------------------------------

    async def serve_episode(self, request: EpisodeRequestT) -> EpisodeResult:
        """Claim the episode's identity, admit, track, run, clean up and account one episode.

        Never raises except on cancellation. See :mod:`rollout_runtime.environment.attempts` for what a second
        attempt of a live or finished episode gets.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        digest = input_digest(request.model_dump(mode="json"))
        if (replayed := self._finished_result(request, digest)) is not None:
            return replayed
        if self.attempts.live(request.episode_id) is not None:
            self.metrics.duplicate_attempt("waited")
        try:
            attempt = await self.attempts.acquire(
                request.episode_id, wait_seconds=self.config.duplicate_attempt_wait_seconds
            )
        except EpisodeInProgress as exc:
            self.metrics.duplicate_attempt("refused")
            log.warning("episode %s: %s", request.episode_id, exc)
            failure = handled_episode_failure(
                "episode_identity", str(exc), terminal=False, failure_kind=EPISODE_IN_PROGRESS
            )
            self.metrics.episode_finished("rejected", loop.time() - started)
            return EpisodeResult(self._adapt(request, failure), EPISODE_IN_PROGRESS_STATUS, "rejected")
        try:
            if (replayed := self._finished_result(request, digest)) is not None:  # the one we waited for finished
                return replayed
            async with self.limiter.slot():
                return await self._run_admitted(request, attempt, digest, started)
        except AdmissionRejected as exc:
            failure = handled_episode_failure(
                "admission",
                str(exc),
                terminal=False,
                failure_kind=ADMISSION_TIMEOUT if exc.timed_out else ADMISSION_REJECTED,
            )
            self.metrics.episode_finished("rejected", loop.time() - started)
            return EpisodeResult(self._adapt(request, failure), 503, "rejected")
        finally:
            self.attempts.release(attempt)

    def _finished_result(self, request: EpisodeRequestT, digest: str) -> EpisodeResult | None:
        result = self.attempts.finished(request.episode_id, digest)
        if result is not None:
            self.metrics.duplicate_attempt("replayed")
            log.info("episode %s already finished here: replying with its result", request.episode_id)
        return result

    async def _run_admitted(
        self, request: EpisodeRequestT, attempt: Attempt, digest: str, started: float
    ) -> EpisodeResult:
        loop = asyncio.get_running_loop()
        steps = EpisodeSteps(
            self.checkpoints,
            episode_id=request.episode_id,
            input_digest=digest,
            exported=self.checkpoint_mode == "exported",
            attempt=attempt,
        )
        episode = EpisodeContext(
            request.episode_id, cleanup=EpisodeCleanupContext(self.config.cleanup_timeout_seconds), steps=steps
        )
        self.episodes.add(episode)
        try:
            response, failure = await self._attempt(request, episode)
        except BaseException:  # cancelled (shutdown, caller gone): release, keep any checkpoint, account, re-raise
            steps.finished = True
            self.checkpoints.untrack(steps)
            try:
                await episode.cleanup.aclose()
            finally:
                self.episodes.discard(episode)  # in flight until its cleanup is done, as on the normal path
                self.metrics.cleanup_failures.inc(len(episode.cleanup.failures))
                self.metrics.episode_finished("failed", loop.time() - started)
            raise
        await episode.cleanup.aclose()
        self.metrics.cleanup_failures.inc(len(episode.cleanup.failures))
        finished = not _keeps_checkpoint(failure)
        try:
            await steps.finish(keep_checkpoint=not finished)
        except CheckpointStoreError as exc:  # e.g. a read-only directory: the memory below still stops a rerun
            log.error("episode %s: could not drop its checkpoint: %s", request.episode_id, exc)
        except Exception:
            log.exception("episode %s: could not drop its checkpoint", request.episode_id)
        self.episodes.discard(episode)
        outcome: EpisodeOutcome = "success"
        status = 200
        if failure is not None:
            if failure.dependency:
                self.metrics.dependency_failed(retryable=not failure.terminal)
            outcome = "timeout" if failure.event.kind == EPISODE_TIMEOUT else "failed"
            if failure.event.kind == CHECKPOINT_STORE_FAILED:
                status = 503  # the server's storage is sick: infra by status too (http_status_is_infra)
            response = self._adapt(request, failure)
        assert response is not None
        self.metrics.episode_finished(outcome, loop.time() - started)
        result = EpisodeResult(response, status, outcome)
        if finished:
            self.attempts.remember(request.episode_id, digest, result)
        return result

    async def _attempt(
        self, request: EpisodeRequestT, episode: EpisodeContext
    ) -> tuple[EpisodeResponse | None, HandledEpisodeFailure | None]:
        deadline: asyncio.Timeout | None = None
        try:
            timeout = self._derive_timeout(request)
            await episode.steps.start()
            async with asyncio.timeout(timeout) as deadline:
                episode.steps.deadline = deadline
                response = await self.run_episode(request, episode)
            if not isinstance(response, EpisodeResponse):
                raise TypeError(f"run_episode returned {type(response).__name__}, not an EpisodeResponse")
            return response, None
        except HandledEpisodeFailure as failure:
            return None, failure
        except TimeoutError as exc:
            if deadline is not None and deadline.expired():
                return None, handled_episode_failure(
                    "episode",
                    f"the episode exceeded its timeout of {self._describe_timeout(request)}",
                    terminal=False,
                    failure_kind=EPISODE_TIMEOUT,
                )
            return None, self._unhandled(request, exc)
        except (CorruptCheckpointError, CheckpointMismatch) as exc:
            log.error("episode %s: %s", request.episode_id, exc)
            return None, handled_episode_failure(
                "checkpoint", str(exc), terminal=True, failure_kind=CHECKPOINT_REJECTED, error_type=type(exc).__name__
            )
        except CheckpointStoreError as exc:
            return None, handled_episode_failure(
                "checkpoint", str(exc), terminal=False, failure_kind=CHECKPOINT_STORE_FAILED, error_type="OSError"
            )
        except Exception as exc:
            return None, self._unhandled(request, exc)
        finally:
            episode.steps.deadline = None

    def _derive_timeout(self, request: EpisodeRequestT) -> float | None:
        try:
            value = self.episode_timeout_seconds(request)
            if value is not None and (isinstance(value, bool) or not math.isfinite(value) or value <= 0):
                raise ValueError(f"an episode timeout must be a positive number of seconds or None, got {value!r}")
        except Exception as exc:
            log.exception("episode %s: the episode timeout hook raised", request.episode_id)
            raise handled_episode_failure(
                "episode_timeout",
                f"deriving the episode timeout failed: {type(exc).__name__}: {exc}",
                terminal=True,
                failure_kind="episode_timeout_invalid",
                error_type=type(exc).__name__,
            ) from None
        return value

    def _describe_timeout(self, request: EpisodeRequestT) -> str:
        try:
            return f"{self.episode_timeout_seconds(request)}s"
        except Exception:
            return "(unknown)"

    def _unhandled(self, request: EpisodeRequestT, exc: BaseException) -> HandledEpisodeFailure:
        log.error("episode %s raised an unhandled %s", request.episode_id, type(exc).__name__, exc_info=exc)
        return unhandled_episode_failure(exc)

    def _adapt(self, request: EpisodeRequestT, failure: HandledEpisodeFailure) -> EpisodeResponse:
        try:
            return self.failure_response(request, failure)
        except Exception:
            log.exception("episode %s: failure_response raised; replying with the default adapter", request.episode_id)
            return BaseEnvironmentServer.failure_response(self, request, failure)

    # -- HTTP ---------------------------------------------------------------------------------------------------

    def setup_webserver(self) -> web.Application:
        """The default app: ``POST /run`` plus everything :func:`setup_environment_app` adds."""
        app = web.Application(client_max_size=self.config.max_request_bytes)
        setup_environment_app(app, self)
        app.router.add_post("/run", self.handle_run)
        return app

    async def handle_run(self, http_request: web.Request) -> web.Response:
        """``POST /run``: one episode. Mount it in custom apps too (after :func:`setup_environment_app`)."""
        if http_request.app.get(SERVER_KEY) is not self:
            raise RuntimeError("call setup_environment_app(app, server) on any app that serves episodes")
        if self.draining:
            raise RequestRejected(503, "draining", "the server is shutting down; send the episode elsewhere")
        body = await read_json_body(http_request, self.config.max_request_bytes)
        try:
            request = self.request_model.model_validate(body)
        except ValidationError as exc:
            raise validation_rejection(exc) from None
        result = await self.serve_episode(request)
        headers = {"Retry-After": "1"} if result.http_status in (503, EPISODE_IN_PROGRESS_STATUS) else None
        return web.json_response(text=result.response.model_dump_json(), status=result.http_status, headers=headers)

    async def handle_health(self, _: web.Request) -> web.Response:
        body = {
            "status": "draining" if self.draining else "ok",
            "protocol": self.protocol_name,
            "episodes_in_flight": len(self.episodes),
            "admission_queue_depth": self.limiter.queued,
            "attempts_waiting": self.attempts.waiting,
            "max_concurrent_episodes": self.config.max_concurrent_episodes,
            "checkpointing": self.checkpoints.enabled,
            "checkpoint_open": self.checkpoints.is_open,
        }
        return web.json_response(body, status=503 if self.draining else 200)

    async def handle_metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_checkpoint_open(self, http_request: web.Request) -> web.Response:
        """Open a checkpoint; reply once every tracked episode is parked and exported (``?wait=false``: at once)."""
        try:
            if http_request.query.get("wait", "true").lower() in ("false", "0", "no"):
                self.checkpoints.begin()
                return web.json_response({"open": True}, status=202)
            manifest = await self.checkpoints.open()
        except CheckpointingOff as exc:
            return error_response(409, "checkpointing_off", str(exc))
        except CheckpointAborted as exc:
            return error_response(409, "checkpoint_aborted", str(exc))
        except OSError as exc:  # a CheckpointStoreError, or a store that raised past it
            log.exception("checkpoint export failed")
            return error_response(
                500,
                "checkpoint_export_failed",
                f"writing the checkpoint failed ({type(exc).__name__}: {exc}); episodes stay parked: retry the open "
                "or resume",
            )
        return web.json_response(text=manifest.model_dump_json())

    async def handle_checkpoint_resume(self, _: web.Request) -> web.Response:
        return web.json_response({"resumed": self.checkpoints.resume()})

    async def handle_checkpoint_state(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "enabled": self.checkpoints.enabled,
                "open": self.checkpoints.is_open,
                "tracked_episodes": self.checkpoints.tracked,
            }
        )

    async def handle_aggregate(self, http_request: web.Request) -> web.Response:
        body = await read_json_body(http_request, self.config.max_request_bytes)
        try:
            request = _AggregateRequest.model_validate(body)
        except ValidationError as exc:
            raise validation_rejection(exc) from None
        tasks = self.aggregate_metrics(request.rollouts, success_threshold=request.success_threshold)
        return web.json_response({"tasks": {k: v.model_dump(mode="json") for k, v in tasks.items()}})

    async def start(self, app: web.Application | None = None, *, shutdown_grace_seconds: float = 5.0) -> RunningServer:
        """Serve on ``config.host:config.port`` (port 0: a free one); returns the bound address.

        On stop, episodes in flight get ``shutdown_grace_seconds`` to finish; then they are cancelled, and their
        cleanup still runs (shielded, bounded). A caller that disconnects cancels its episode the same way
        (``handler_cancellation``): nobody is left to read the reply, and a redispatch may be waiting for it.
        """
        runner = web.AppRunner(
            app or self.setup_webserver(),
            access_log=None,
            shutdown_timeout=shutdown_grace_seconds,
            handler_cancellation=True,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        port = int(runner.addresses[0][1])
        return RunningServer(url=f"http://{self.config.host}:{port}", port=port, runner=runner)


def _keeps_checkpoint(failure: HandledEpisodeFailure | None) -> bool:
    """A retry may continue an infra-failed episode; a rejected checkpoint file stays for an operator to inspect."""
    if failure is None:
        return False
    return not failure.terminal or failure.event.kind == CHECKPOINT_REJECTED


def setup_environment_app(app: web.Application, server: BaseEnvironmentServer[Any, Any]) -> None:
    """Make ``app`` serve ``server``'s lifecycle: call this from any ``setup_webserver`` that builds its own app.

    Adds JSON errors (no tracebacks to callers), ``GET /health``, ``GET /metrics``, the checkpoint control routes
    (``POST /checkpoint/open``, ``POST /checkpoint/resume``, ``GET /checkpoint``), ``POST /aggregate_metrics``, and
    marks the app so :meth:`BaseEnvironmentServer.handle_run` accepts episodes from it (so every episode is
    tracked). On shutdown the server reports ``draining`` and refuses new episodes.
    """
    app[SERVER_KEY] = server
    app.middlewares.append(json_errors_middleware)
    app.router.add_get("/health", server.handle_health)
    app.router.add_get("/metrics", server.handle_metrics)
    app.router.add_post("/checkpoint/open", server.handle_checkpoint_open)
    app.router.add_post("/checkpoint/resume", server.handle_checkpoint_resume)
    app.router.add_get("/checkpoint", server.handle_checkpoint_state)
    app.router.add_post("/aggregate_metrics", server.handle_aggregate)

    async def _drain(_: web.Application) -> None:
        server.draining = True
        server.checkpoints.resume()  # parked episodes finish or are cancelled; their exported state stays

    app.on_shutdown.append(_drain)
