# Sourced by the scripts below: make (or reuse) the project's virtualenv and install into it.
#   RLHF_JAX_VENV  where the venv lives (default: .venv in the repository)
#   PYTHON         the interpreter to build it from (default: python3, must be >= 3.11)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RLHF_JAX_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

ensure_venv() {  # ensure_venv EXTRAS  (e.g. "test"; the demo needs only "hf")
  local extras="$1"
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -c 'import sys; assert sys.version_info >= (3, 11), f"rlhf_jax needs Python >= 3.11, got {sys.version}"'
    echo "[rlhf_jax] creating virtualenv $VENV" >&2
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
  fi
  # Re-running is cheap when everything is installed; it also picks up new requirements.
  echo "[rlhf_jax] installing rlhf-jax[$extras] into $VENV" >&2
  local log="$VENV/pip-install.log"
  if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -e "$ROOT[$extras]" \
      >"$log" 2>&1; then
    cat "$log" >&2
    echo "[rlhf_jax] pip install failed (log above, kept in $log)" >&2
    return 1
  fi
  "$VENV/bin/python" -c "import rlhf_jax" >/dev/null
}
