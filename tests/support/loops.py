"""Close the event loop that looptime 0.9 creates around every sync test, so ``filterwarnings = error`` holds.

looptime's ``pytest_pyfunc_call`` calls ``event_loop_policy.get_event_loop()`` for every test (pytest-asyncio's
policy fixture is autouse), which for a sync test creates and sets a new loop that nobody closes. The next async test
replaces it, the orphan is garbage-collected, and its ResourceWarning fails whichever test is running then. This
wrapper closes only a loop that appeared during a sync test's call and is not running.
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
    try:
        return (yield)
    finally:
        after = _policy_loop(policy)
        if before is None and after is not None and not after.is_running():
            policy.set_event_loop(None)
            after.close()
