"""Where the vLLM tool lives and the tiny model it serves: one lookup for the tests, the benchmarks and the demo.

``scripts/install-tools.sh vllm`` installs vLLM's CPU build in its own venv, ``<cache>/tools/vllm-<version>/``
(the version pinned in ``tools/versions.env``), marked complete by a ``.complete`` stamp. The tiny model is generated
by that venv's interpreter (:mod:`rollout_runtime.vllm.tiny_model`: the project's venv has no torch) and cached in
the tool's directory, keyed by a hash of the generator: it belongs to that vLLM and torch, and an edit of the
generator writes a new one.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rollout_runtime.vllm.server import TINY_MODEL_SCRIPT, generate_tiny_model

__all__ = ["INSTALL_COMMAND", "TOOL_ENV", "TinyModel", "VllmMissing", "VllmTool"]

INSTALL_COMMAND: Final[str] = "bash scripts/install-tools.sh vllm"
TOOL_ENV: Final[str] = "ROLLOUT_FLEET_VLLM_TOOL"
"""The tool's directory, as ``scripts/demo`` exports it from the pin."""


class VllmMissing(RuntimeError):
    """The vLLM tool is not installed where it was looked for; the message says how to install it."""


@dataclass(frozen=True)
class TinyModel:
    """The generated model's two weight sets (same tokenizer and shapes): ``v1`` serves, ``v2`` is for reloads."""

    root: Path

    @property
    def v1(self) -> Path:
        return self.root / "v1"

    @property
    def v2(self) -> Path:
        return self.root / "v2"


@dataclass(frozen=True)
class VllmTool:
    """The installed tool: ``VllmTool(<cache>/tools/vllm-<version>)``."""

    directory: Path

    @classmethod
    def from_env(cls) -> VllmTool:
        """The tool named by ``$ROLLOUT_FLEET_VLLM_TOOL`` (``scripts/demo`` sets it), or VllmMissing."""
        value = os.environ.get(TOOL_ENV)
        if not value:
            raise VllmMissing(f"${TOOL_ENV} is not set: run through scripts/demo, or set it to the tool's directory")
        return cls(Path(value))

    @property
    def python(self) -> Path:
        """The venv's interpreter (``python -m vllm.entrypoints.openai.api_server``: the wheel's ``vllm`` crashes)."""
        return self.directory / "bin" / "python"

    def require(self) -> VllmTool:
        """This tool if it is installed, else VllmMissing with the command that installs it."""
        if not (self.directory / ".complete").is_file() or not os.access(self.python, os.X_OK):
            raise VllmMissing(
                f"vLLM is not installed in {self.directory}: run `{INSTALL_COMMAND}` "
                "(about 3 GB downloaded, 6 GB on disk, a few minutes)"
            )
        return self

    def tiny_model(self) -> TinyModel:
        """The tiny model, generated on first use (~30 s, mostly torch's import) and reused after."""
        key = hashlib.sha256(TINY_MODEL_SCRIPT.read_bytes()).hexdigest()[:12]
        model = TinyModel(self.directory / "models" / f"tiny-llama-{key}")
        generate_tiny_model(self.require().python, model.root)
        return model
