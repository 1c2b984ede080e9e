"""``rollout-fleet classify``: show how the failure taxonomy buckets typical rollout failures.

A smoke path for a fresh install and a quick answer to "would this error be retried?".
"""

from __future__ import annotations

import aiohttp
import click
from rich.console import Console
from rich.table import Table

from rollout_runtime.cli.options import command_help
from rollout_runtime.failures import (
    FailureClass,
    RolloutDataFailure,
    classify_rollout_failure,
    failure_type,
    http_status_is_infra,
    to_picklable_failure,
)
from rollout_runtime.http_verdicts import SHARD_OR_FLEET


def _response_error(status: int, message: str) -> aiohttp.ClientResponseError:
    return aiohttp.ClientResponseError(request_info=None, history=(), status=status, message=message)  # type: ignore[arg-type]


def _wrapped(exc: BaseException, outer: BaseException) -> BaseException:
    outer.__cause__ = exc
    return outer


def sample_failures() -> list[tuple[str, BaseException]]:
    """Failures a trainer meets in practice, each with the story behind it."""
    return [
        ("shard process died", ConnectionRefusedError(111, "Connection refused")),
        ("shard hung past the deadline", TimeoutError()),
        ("connection dropped mid-response", aiohttp.ServerDisconnectedError()),
        ("vLLM overloaded", _response_error(503, "Service Unavailable")),
        ("rate limited", _response_error(429, "Too Many Requests")),
        ("prompt longer than max_model_len", _response_error(400, "maximum context length is 4096 tokens")),
        ("wrapper around a dead socket", _wrapped(ConnectionResetError(), RuntimeError("generation failed"))),
        ("explicit data failure over an infra cause", _wrapped(TimeoutError(), RolloutDataFailure("bad prompt"))),
        ("a bug in the rollout function", KeyError("reward")),
        ("group: two shards down at once", ExceptionGroup("batch", [ConnectionResetError(), TimeoutError()])),
    ]


def _http_statuses(ctx: click.Context, param: click.Parameter, statuses: tuple[int, ...]) -> tuple[int, ...]:
    """Refuse a status outside 100..599 before anything is printed: the user typed something that is not HTTP."""
    for status in statuses:
        if not 100 <= status <= 599:
            raise click.BadParameter(f"HTTP status must be within 100..599, got {status}", ctx, param)
    return statuses


@click.command(
    help=command_help("classify", "INFRA is redispatched to another shard; DATA has a small budget and is reported.")
)
@click.option(
    "--status",
    "statuses",
    type=int,
    multiple=True,
    callback=_http_statuses,
    help="Also classify these HTTP statuses.",
)
def classify(statuses: tuple[int, ...]) -> None:
    console = Console()
    table = Table(title="How rollout-fleet classifies failed attempts")
    table.add_column("situation")
    table.add_column("exception")
    table.add_column("class")
    table.add_column("after a process boundary")
    for story, exc in sample_failures():
        verdict = classify_rollout_failure(exc)
        crossed = to_picklable_failure(exc)
        colour = "yellow" if verdict is FailureClass.INFRA else "red"
        table.add_row(
            story,
            failure_type(exc),
            f"[{colour}]{verdict.value}[/]",
            f"{type(crossed).__name__} -> {classify_rollout_failure(crossed).value}",
        )
    console.print(table)
    for status in statuses:
        note = " (never the prompt's: one shard answering it is ejected, every shard ends the run)"
        shown = "infra" if http_status_is_infra(status) else "data" + (note if status in SHARD_OR_FLEET else "")
        console.print(f"HTTP {status}: {shown}", soft_wrap=True)
