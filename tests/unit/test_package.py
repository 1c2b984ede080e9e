"""The package's public surface: one place to import from, cheap to import."""

from __future__ import annotations

import subprocess
import sys

import rollout_runtime


def test_every_public_name_resolves() -> None:
    for name in rollout_runtime.__all__:
        assert getattr(rollout_runtime, name) is not None, name


def test_importing_the_runtime_loads_neither_the_dispatcher_nor_kubernetes() -> None:
    code = (
        "import sys, rollout_runtime\n"
        "heavy = [m for m in ('rollout_runtime.dispatch', 'kubernetes_asyncio', 'kopf', 'ray') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_unknown_names_raise_attribute_error() -> None:
    assert not hasattr(rollout_runtime, "NoSuchThing")
