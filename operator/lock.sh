#!/usr/bin/env bash
# Re-pin the operator image's Python dependencies (by version and hash) for operator/Dockerfile:
#   operator/requirements.lock        the runtime dependencies of pyproject.toml (no extras)
#   operator/build-requirements.lock  the build backend (hatchling) used to build the project's wheel
# Run after changing dependencies in pyproject.toml; commit both files. Needs the uv that scripts/bootstrap.sh installs
# (it does not touch .venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${ROLLOUT_FLEET_CACHE:-$HOME/.cache/rollout-fleet}"
UV="$(ls -d "$CACHE"/uv-*/bin/uv 2>/dev/null | sort -V | tail -1)"
[[ -x "$UV" ]] || { echo "uv not found under $CACHE: run scripts/test or scripts/demo once" >&2; exit 1; }
export UV_CACHE_DIR="$CACHE/uv-cache"
cd "$ROOT"
# Python and platform of the image's base (python:3.11-slim-bookworm, glibc 2.36, amd64).
common=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --quiet
        --custom-compile-command "operator/lock.sh")
"$UV" pip compile pyproject.toml "${common[@]}" -o operator/requirements.lock
"$UV" pip compile operator/build-requirements.in "${common[@]}" -o operator/build-requirements.lock
