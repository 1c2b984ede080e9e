"""How a rollout tells the dispatcher it is making progress: :func:`report_progress`, a no-op outside an attempt.

The dispatcher binds an attempt's progress sink in a context variable before it calls ``rollout(shard, prompt)``;
:class:`~rollout_runtime.generation.GenerationClient` calls :func:`report_progress` for every streamed chunk. A
rollout with its own transport can call it too. Cheap enough per token: one context-variable lookup and a call.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

__all__ = ["ProgressSink", "bind_progress", "report_progress", "unbind_progress"]

ProgressSink = Callable[[int], None]
"""Called with the number of tokens that just arrived."""

_SINK: contextvars.ContextVar[ProgressSink | None] = contextvars.ContextVar("rollout_progress_sink", default=None)


def report_progress(tokens: int = 1) -> None:
    """Tell the attempt's progress watchdog that ``tokens`` more tokens arrived (nothing outside an attempt)."""
    sink = _SINK.get()
    if sink is not None:
        sink(tokens)


def bind_progress(sink: ProgressSink | None) -> contextvars.Token[ProgressSink | None]:
    """Bind ``sink`` for the current task's context; reset with the returned token."""
    return _SINK.set(sink)


def unbind_progress(token: contextvars.Token[ProgressSink | None]) -> None:
    _SINK.reset(token)
