# Sourced by scripts/bootstrap.sh, scripts/build-wheel and operator/lock.sh: install the pinned uv once (cached) and
# set UV to it. Everything downloaded is cached outside the checkout, under ${ROLLOUT_FLEET_CACHE:-~/.cache/rollout-fleet}.
set -euo pipefail

export ROLLOUT_FLEET_CACHE="${ROLLOUT_FLEET_CACHE:-$HOME/.cache/rollout-fleet}"
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# The pin lives with the others in tools/versions.env (tools/pins.py checks that PyPI still serves it).
UV_VERSION="$(sed -n 's/^UV_VERSION=//p' "$(dirname "${BASH_SOURCE[0]}")/../tools/versions.env")"
[ -n "$UV_VERSION" ] || die "tools/versions.env has no UV_VERSION"
UV_HOME="$ROLLOUT_FLEET_CACHE/uv-$UV_VERSION"
export UV_CACHE_DIR="$ROLLOUT_FLEET_CACHE/uv-cache"

PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || die "python3 (>= 3.11) is required and was not found on PATH"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "Python >= 3.11 is required; $("$PYTHON" --version) found (set PYTHON=/path/to/python3.11)"

if [ ! -x "$UV_HOME/bin/uv" ]; then
  say "installing uv $UV_VERSION into $UV_HOME"
  "$PYTHON" -m venv "$UV_HOME"
  "$UV_HOME/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" \
    || die "could not install uv $UV_VERSION from PyPI"
fi
UV="$UV_HOME/bin/uv"
