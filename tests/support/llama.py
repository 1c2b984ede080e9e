"""A real OpenAI-compatible server this project did not write: llama.cpp's, via llama-cpp-python.

``scripts/install-tools.sh llama-server`` builds llama-cpp-python from its sdist (it vendors llama.cpp and builds it
with cmake) into its own venv in the tool cache; ``python -m llama_cpp.server`` from that venv is the server. The
model is generated here, not downloaded: :func:`write_tiny_llama` writes a random-weight llama (2 layers, 64
dimensions, a few hundred SentencePiece tokens with byte fallback) with the ``gguf`` package, which llama.cpp loads
in well under a second. Its output is gibberish, which is all the tests need: real HTTP status codes, bodies,
streams and failure modes from real code.

Fixtures: ``tiny_llama_model`` (one model file per session) and ``llama_servers`` (a factory: ``start(count)``
starts that many servers on 127.0.0.1 and returns them ready; each is a :class:`ManagedProcess`, so tests can
``kill()``, ``hang()`` and ``resume()`` it for real; teardown stops them all).
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from support.processes import ManagedProcess, free_ports, wait_until
from support.tools import INSTALL_HINT, ToolMissingError, cache_root, versions

MODEL_ALIAS = "tiny-llama"
CONTEXT_TOKENS = 256
"""The server's context window (``--n_ctx``): small, so a context overflow is one long prompt away."""

_EMBED, _HEADS, _LAYERS, _FFN = 64, 4, 2, 128
_PIECES = [
    *"abcdefghijklmnopqrstuvwxyz",
    *(f"\u2581{c}" for c in "abcdefghijklmnopqrstuvwxyz"),
    *(f"\u2581{w}" for w in ("the", "a", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for")),
    *("er", "in", "on", "an", "re", "at", "en", "ed", "es", "or", "ing", "ion", "th", "he", "nd", "ou", "st"),
    "\u2581",
    *"0123456789.,!?:;'\"-()",
]


def llama_server_python() -> Path:
    """The interpreter of the venv llama-cpp-python was built into, or ToolMissingError with the fix."""
    version = versions()["LLAMA_CPP_PYTHON_VERSION"]
    tool_dir = cache_root() / "tools" / f"llama-cpp-python-{version}"
    python = tool_dir / "bin" / "python"
    if not (tool_dir / ".complete").is_file() or not os.access(python, os.X_OK):
        raise ToolMissingError(
            f"llama-cpp-python {version} is not installed in {tool_dir}: {INSTALL_HINT} "
            "(or `bash scripts/install-tools.sh llama-server` alone)"
        )
    return python


def write_tiny_llama(path: Path, *, seed: int = 0) -> Path:
    """Write a random-weight llama GGUF model that llama.cpp loads: a valid architecture, vocabulary and template."""
    import gguf  # the test extra; imported here so collecting the suite does not need numpy
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *dict.fromkeys(_PIECES)]
    types = [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        *([gguf.TokenType.BYTE] * 256),
        *([gguf.TokenType.NORMAL] * (len(tokens) - 259)),
    ]
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("rollout-fleet tiny random llama")
    writer.add_context_length(CONTEXT_TOKENS)
    writer.add_embedding_length(_EMBED)
    writer.add_block_count(_LAYERS)
    writer.add_feed_forward_length(_FFN)
    writer.add_head_count(_HEADS)
    writer.add_head_count_kv(_HEADS)
    writer.add_rope_dimension_count(_EMBED // _HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )

    def weight(*shape: int) -> object:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(_EMBED, dtype=np.float32)
    # numpy shapes are (rows, columns): ggml's ne reversed, e.g. token_embd is ne {n_embd, n_vocab}.
    writer.add_tensor("token_embd.weight", weight(len(tokens), _EMBED))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weight(len(tokens), _EMBED))
    for layer in range(_LAYERS):
        blk = f"blk.{layer}"
        writer.add_tensor(f"{blk}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{blk}.{name}.weight", weight(_EMBED, _EMBED))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones)
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(_FFN, _EMBED))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(_FFN, _EMBED))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(_EMBED, _FFN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@dataclass
class LlamaServer:
    """One running llama.cpp server process on 127.0.0.1."""

    process: ManagedProcess
    port: int

    @property
    def url(self) -> str:
        """The server's base URL (its OpenAI API is under ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return self.process.name

    def ready(self) -> bool:
        """True once it answers ``GET /v1/models`` with 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=1.0) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_until(self.ready, timeout=timeout, what=f"{self.name} answering GET /v1/models", process=self.process)

    def restart(self) -> None:
        """Start it again on the same port (after a kill) and wait until it answers."""
        self.process.start()
        self.wait_ready()


class StartLlamaServers(Protocol):
    def __call__(self, count: int = 1) -> list[LlamaServer]: ...


@pytest.fixture(scope="session")
def tiny_llama_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One generated model file for the session."""
    return write_tiny_llama(tmp_path_factory.mktemp("llama") / "tiny-llama.gguf")


@pytest.fixture
def llama_servers(tiny_llama_model: Path, tmp_path: Path) -> Iterator[StartLlamaServers]:
    """A factory of real llama.cpp servers: ``start(count)`` returns them ready; all are stopped at teardown."""
    python = llama_server_python()
    started: list[LlamaServer] = []

    def start(count: int = 1) -> list[LlamaServer]:
        servers = []
        for port in free_ports(count):
            name = f"llama-{len(started)}"
            argv = [
                python,
                "-m",
                "llama_cpp.server",
                "--model",
                tiny_llama_model,
                "--model_alias",
                MODEL_ALIAS,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                str(CONTEXT_TOKENS),
                "--n_threads",
                "1",
            ]
            server = LlamaServer(ManagedProcess(name, argv, tmp_path / f"{name}.log"), port)
            server.process.start()
            started.append(server)
            servers.append(server)
        for server in servers:
            server.wait_ready()
        return servers

    try:
        yield start
    finally:
        for server in started:
            server.process.stop()
