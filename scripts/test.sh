#!/usr/bin/env bash
# The whole test suite: installs rlhf-jax[test] into .venv, then runs pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k gae`).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_venv test
cd "$ROOT"
export JAX_PLATFORMS=cpu
"$VENV/bin/python" -m pytest "$@"
