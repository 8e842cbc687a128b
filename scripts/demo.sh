#!/usr/bin/env bash
# The main job. For now: a short tour of the kernels on a toy rollout batch.
# Extra arguments go to launch/demo.py (e.g. `--config.group_size=4`).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_venv hf
cd "$ROOT"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
"$VENV/bin/python" launch/demo.py --config=configs/kernel_demo.py "$@"
