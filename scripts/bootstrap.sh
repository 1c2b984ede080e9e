# Sourced by scripts/demo and scripts/test: make .venv with the project installed (editable).
# Usage: source scripts/bootstrap.sh [extra]   (extra: "" for the demo, "test" for the suite)
# Everything downloaded is cached outside the checkout, under ${ROLLOUT_FLEET_CACHE:-~/.cache/rollout-fleet}.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROLLOUT_FLEET_CACHE="${ROLLOUT_FLEET_CACHE:-$HOME/.cache/rollout-fleet}"
UV_VERSION="0.13.8"
UV_HOME="$ROLLOUT_FLEET_CACHE/uv-$UV_VERSION"
export UV_CACHE_DIR="$ROLLOUT_FLEET_CACHE/uv-cache"
EXTRA="${1:-}"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

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

VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$UV" venv --quiet --python "$PYTHON" "$VENV"
fi

spec="."
[ -n "$EXTRA" ] && spec=".[$EXTRA]"
stamp="$VENV/.installed-$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)-${EXTRA:-base}"
if [ ! -f "$stamp" ]; then
  say "installing rollout-fleet${EXTRA:+[$EXTRA]} into $VENV"
  (cd "$ROOT" && "$UV" pip install --quiet --python "$VENV/bin/python" -e "$spec") \
    || die "dependency installation failed (see the uv output above)"
  rm -f "$VENV"/.installed-* && touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
