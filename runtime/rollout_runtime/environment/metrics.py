"""Prometheus metrics of one environment server (the ``environment_*`` names in docs/metrics.md).

The registry is the caller's choice: a fresh one by default (so several servers can live in one test process),
``prometheus_client.REGISTRY`` to join the process-wide one.
"""

from __future__ import annotations

from typing import Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["DUPLICATE_ATTEMPT_ACTIONS", "EPISODE_OUTCOMES", "STORE_OPERATIONS", "EnvironmentMetrics", "EpisodeOutcome"]

EpisodeOutcome = Literal["success", "failed", "timeout", "rejected"]
EPISODE_OUTCOMES: Final[tuple[EpisodeOutcome, ...]] = ("success", "failed", "timeout", "rejected")
DuplicateAttemptAction = Literal["waited", "refused", "replayed"]
DUPLICATE_ATTEMPT_ACTIONS: Final[tuple[DuplicateAttemptAction, ...]] = ("waited", "refused", "replayed")
STORE_OPERATIONS: Final[tuple[str, ...]] = ("load", "save", "delete")

_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip


class EnvironmentMetrics:
    """The environment server's metrics, registered once per instance on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.episodes = Counter(
            "environment_episodes_total",
            "Episodes finished, by outcome. A rising failed/timeout share means the environment or its "
            "dependencies are sick; rejected means admission is saturated (raise concurrency or add servers).",
            ["outcome"],
            registry=self.registry,
        )
        self.episode_duration = Histogram(
            "environment_episode_duration_seconds",
            "Wall-clock seconds from admission to reply, by outcome (parked checkpoint time included). "
            "Timeouts piling up at the episode deadline point at a hung dependency.",
            ["outcome"],
            buckets=_DURATION_BUCKETS,
            registry=self.registry,
        )
        self.cleanup_failures = Counter(
            "environment_cleanup_failures_total",
            "Cleanup callbacks that raised or timed out. Each one may have leaked a remote resource "
            "(a sandbox, a container) that now relies on the owner's expiry or reaping.",
            registry=self.registry,
        )
        self.dependency_failures = Counter(
            "environment_dependency_failures_total",
            "Episodes failed by a call to another server, by whether another attempt may succeed. "
            'retryable="true" is a sick dependency; retryable="false" is a request the dependency refuses.',
            ["retryable"],
            registry=self.registry,
        )
        self.episodes_in_flight = Gauge(
            "environment_episodes_in_flight",
            "Episodes admitted and not yet replied to (parked ones included).",
            registry=self.registry,
        )
        self.admission_queue_depth = Gauge(
            "environment_admission_queue_depth",
            "Episodes waiting for a concurrency slot. Persistently non-zero means the server is saturated.",
            registry=self.registry,
        )
        self.duplicate_attempts = Counter(
            "environment_duplicate_attempts_total",
            "Attempts that arrived while their episode_id had a live attempt here, or had already finished, by "
            "action: waited (for the live one to end), refused (409 episode_in_progress: it was still live), "
            "replayed (got the finished result again). Steady refusals: callers redispatch faster than attempts end.",
            ["action"],
            registry=self.registry,
        )
        self.attempts_waiting = Gauge(
            "environment_episode_attempts_waiting",
            "Attempts waiting for a live attempt of the same episode_id to end (it is being cancelled or finishing).",
            registry=self.registry,
        )
        self.checkpoint_store_failures = Counter(
            "environment_checkpoint_store_failures_total",
            "Checkpoint store calls that failed with a storage error, by operation (load, save, delete). "
            "Any is an operator problem: a read-only or full volume, a path that is not a file.",
            ["operation"],
            registry=self.registry,
        )
        for action in DUPLICATE_ATTEMPT_ACTIONS:
            self.duplicate_attempts.labels(action=action)
        for operation in STORE_OPERATIONS:
            self.checkpoint_store_failures.labels(operation=operation)
        for outcome in EPISODE_OUTCOMES:  # every series exists from the start, at zero
            self.episodes.labels(outcome=outcome)
            self.episode_duration.labels(outcome=outcome)
        for retryable in ("true", "false"):
            self.dependency_failures.labels(retryable=retryable)

    def episode_finished(self, outcome: EpisodeOutcome, duration_seconds: float) -> None:
        self.episodes.labels(outcome=outcome).inc()
        self.episode_duration.labels(outcome=outcome).observe(max(0.0, duration_seconds))

    def dependency_failed(self, *, retryable: bool) -> None:
        self.dependency_failures.labels(retryable="true" if retryable else "false").inc()

    def duplicate_attempt(self, action: DuplicateAttemptAction) -> None:
        self.duplicate_attempts.labels(action=action).inc()

    def checkpoint_store_failed(self, operation: str) -> None:
        self.checkpoint_store_failures.labels(operation=operation).inc()
