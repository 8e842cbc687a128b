#!/usr/bin/env bash
# The main job: DAPO teaches the built-in arith model to carry, on a CPU.
#   1) SFT warm start from scratch, imitating a teacher that drops 60% of its carries
#      (skipped when runs/arith_sft exists; ~4 min on 2 cores),
#   2) DAPO in a fresh run directory runs/demo-<time>, with a progress line per step,
#   3) held-out greedy accuracy before → after, and a per-level table (report.md) and
#      curves (report.png) in the run directory.
# Extra arguments go to launch/train.py (e.g. `--config.train.steps=80`, `--config.seed=1`).
# The kernel tour of earlier versions: python launch/demo.py --config=configs/kernel_demo.py
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_venv hf,tensorboard,plot
cd "$ROOT"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
RUNS="${RLHF_JAX_RUNS:-$ROOT/runs}"
WORKDIR="$RUNS/demo-$(date +%Y%m%d-%H%M%S)"
"$VENV/bin/python" launch/train.py --config=configs/dapo.py:arith \
  --config.model.checkpoint="$RUNS/arith_sft" --workdir="$WORKDIR" "$@"
"$VENV/bin/python" launch/report.py --workdir="$WORKDIR"
