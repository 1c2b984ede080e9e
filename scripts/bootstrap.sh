# Sourced by scripts/demo and scripts/test: make .venv with the project installed (editable).
# Usage: source scripts/bootstrap.sh [extra]   (extra: "" for the demo, "test" for the suite)
# Everything downloaded is cached outside the checkout, under ${ROLLOUT_FLEET_CACHE:-~/.cache/rollout-fleet}.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRA="${1:-}"
source "$ROOT/scripts/uv.sh"   # ROLLOUT_FLEET_CACHE, UV (the pinned uv), say, die, PYTHON

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
