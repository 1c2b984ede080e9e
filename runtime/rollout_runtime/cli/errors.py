"""How ``rollout-fleet`` reports a user's mistake: one line on stderr that says what to fix, never a traceback.

Two classes of error, two exit codes (as click and most Unix tools use them):

- **usage** (exit 2): the command line itself is wrong, an unknown option, a value out of range, an option without
  the one it needs. Click's parameter types (``IntRange``, ``Choice``) catch most; what a config built from the
  options refuses (a cross-field rule) is one too, see :func:`rollout_runtime.cli.options.config_from_options`.
- **runtime** (exit 1): the command line is fine but the world is not: no kubeconfig, an API server that cannot be
  reached or says no, a port that is taken, invalid settings in the environment.

:func:`describe_error` turns the known runtime errors into their one line (pure, so it is unit-tested without
raising anything); :class:`rollout_runtime.cli.LazyGroup` is the one place that calls it. Anything it does not know
is a bug: still one line, naming the exception and ``--debug``, which re-raises everything with its traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

import click
from pydantic import ValidationError

__all__ = ["OneLineUsageError", "describe_error", "describe_validation_error", "one_line_usage"]


class OneLineUsageError(click.UsageError):
    """A usage error shown as one line: the message and where the command's help is (click prints four lines)."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"Error: {self.format_message()}", file=file, err=file is None)


def one_line_usage(error: click.UsageError) -> OneLineUsageError:
    """``error`` as one line, ending with the ``--help`` of the command it is about."""
    message = error.format_message()
    if error.ctx is not None:
        message = f"{message} (see '{error.ctx.command_path} --help')"
    return OneLineUsageError(message)


def _reason(message: str) -> str:
    """A pydantic message without its prefix, on one line."""
    return " ".join(message.removeprefix("Value error, ").split())


def describe_validation_error(error: ValidationError, options: Mapping[str, str]) -> str:
    """One line naming each offending value (as ``--flag=value`` when ``options`` maps its field to a flag) and
    what it must be. Pure."""
    problems = []
    for detail in error.errors(include_url=False):
        field = ".".join(str(part) for part in detail["loc"])
        reason = _reason(detail["msg"])
        if field in options:
            problems.append(f"{options[field]}={detail['input']!r}: {reason}")
        else:
            problems.append(f"{field}: {reason}" if field else reason)
    return "; ".join(problems)


def _api_error(exc: Any) -> str:
    """An ApiException as the API server's own one-line message (its Status body), not the headers and body dump."""
    detail = str(exc.reason or "").strip()
    try:
        body = json.loads(exc.body) if exc.body else {}
        detail = str(body.get("message") or detail) if isinstance(body, dict) else detail
    except (TypeError, ValueError):
        pass
    status = f"{exc.status} " if exc.status else ""
    return f"the API server answered {status}{detail}".rstrip()


def describe_error(exc: BaseException) -> str | None:
    """The one-line message for a known runtime error, or None when ``exc`` is not one (a bug). Pure."""
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.config import ConfigException

    if isinstance(exc, ConfigException):
        return f"{' '.join(str(exc).split())} (set KUBECONFIG to a kubeconfig file)"
    if isinstance(exc, ApiException):
        return _api_error(exc)
    if isinstance(exc, ValidationError):
        return f"invalid {exc.title}: {describe_validation_error(exc, {})}"
    if isinstance(exc, TimeoutError):  # before OSError, whose subclass it is
        return str(exc) or "timed out"
    if isinstance(exc, OSError):  # ConnectionError, a missing or unreadable file, a port that is taken
        if exc.strerror and exc.filename:
            return f"{exc.strerror}: {exc.filename}"
        return " ".join(str(exc).split()) or type(exc).__name__
    return None
