"""The real-vLLM tier: every test here runs against vLLM's CPU build (tests/support/vllm.py) and carries the
``vllm`` marker, so ``pytest -m vllm`` runs the tier alone and ``-m "not vllm"`` deselects it by name."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
TIER_TIMEOUT_SECONDS = 1200
"""The first test of the session also pays for starting the servers (three at once on two shared cores: minutes);
each start is bounded by its own deadline (support.vllm.START_TIMEOUT_SECONDS), so this only catches a hang."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUT_SECONDS))
