#!/usr/bin/env bash
# Re-pin the operator image's Python dependencies (by version and hash) for operator/Dockerfile:
#   operator/requirements.lock        the runtime dependencies of pyproject.toml (no extras)
#   operator/build-requirements.lock  the build backend (hatchling) used to build the project's wheel
# Run after changing dependencies in pyproject.toml; commit both files. Uses the uv pinned in scripts/uv.sh
# (installed on first use; it does not touch .venv).
#
# The locks are universal (`--universal`): one resolution for every platform, with environment markers where a
# dependency is platform-specific, and the hashes of every wheel of each pinned version, so the same files install
# on linux/amd64 and linux/arm64 (`docker buildx build --platform linux/amd64,linux/arm64`). Python is the image's,
# 3.11 (python:3.11-slim-bookworm).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/uv.sh"
cd "$ROOT"
common=(--universal --python-version 3.11 --generate-hashes --quiet --custom-compile-command "operator/lock.sh")
"$UV" pip compile pyproject.toml "${common[@]}" -o operator/requirements.lock
"$UV" pip compile operator/build-requirements.in "${common[@]}" -o operator/build-requirements.lock
