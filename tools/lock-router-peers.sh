#!/usr/bin/env bash
# Re-pin bench/router_overhead.py's field routers (vllm-router, sglang-router) and their Python dependencies, by
# version and hash, into tools/router-peers.lock, from the versions in tools/versions.env. Run after changing either
# pin; commit the lock. Uses the uv pinned in scripts/uv.sh. Universal (every platform's wheels), Python 3.11.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/uv.sh"
source "$ROOT/tools/versions.env"
cd "$ROOT"
printf 'vllm-router==%s\nsglang-router==%s\n' "$VLLM_ROUTER_VERSION" "$SGLANG_ROUTER_VERSION" |
  "$UV" pip compile - --universal --python-version 3.11 --generate-hashes --quiet \
    --custom-compile-command "tools/lock-router-peers.sh" -o tools/router-peers.lock
