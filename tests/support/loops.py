"""Close the event loop that looptime 0.9 creates around every sync test, so ``filterwarnings = error`` holds.

looptime's ``pytest_pyfunc_call`` calls ``event_loop_policy.get_event_loop()`` for every test (pytest-asyncio's
policy fixture is autouse), which for a sync test creates and sets a new loop that nobody closes. The next async test
replaces it, the orphan is garbage-collected, and its ResourceWarning fails whichever test is running then. This
wrapper gives each sync test a loop of its own and closes it, and any other loop that appeared during the call, when
the call ends (unless it is running).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator

import pytest


def _policy_loop(policy: asyncio.AbstractEventLoopPolicy) -> asyncio.AbstractEventLoop | None:
    """The loop a default policy holds for this thread, read without creating one (private, hence defensive)."""
    local = getattr(policy, "_local", None)
    loop = getattr(local, "_loop", None)
    return loop if isinstance(loop, asyncio.AbstractEventLoop) else None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[None]:
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        return (yield)
    policy = asyncio.get_event_loop_policy()
    before = _policy_loop(policy)
    # Give the test a loop of ours for looptime to find: a sync test that calls asyncio.run() (a CLI command under
    # click's CliRunner) ends by *unsetting* the current loop, so a loop looptime created would be out of sight here.
    ours = policy.new_event_loop() if before is None else None
    if ours is not None:
        policy.set_event_loop(ours)
    try:
        return (yield)
    finally:
        after = _policy_loop(policy)
        # A loop left set by an earlier test that this one unset (asyncio.run() ends with set_event_loop(None)) is
        # out of everyone's reach now: close it too, or its garbage collection fails a later test.
        stale = {after, ours} - {before, None}
        if before is not None and after is not before:
            stale.add(before)
        for loop in stale:
            if loop is not None and not loop.is_running() and not loop.is_closed():
                if _policy_loop(policy) is loop:
                    policy.set_event_loop(None)
                loop.close()
