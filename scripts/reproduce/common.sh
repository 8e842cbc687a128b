# Sourced by the rows of docs/reproductions.md: the venv, a shared XLA compilation
# cache (the arms of a row compile the same programs), and the sweep's defaults.
#   RLHF_JAX_RUNS  where the runs go (default: runs/ in the repository); each row's
#                  runs in $RLHF_JAX_RUNS/repro/<family>, warm starts beside them.
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
ensure_venv hf,plot
cd "$ROOT"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
REPRO="${RLHF_JAX_RUNS:-$ROOT/runs}/repro"
DOCS="$ROOT/docs/reproductions"
mkdir -p "$REPRO" "$DOCS"
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$REPRO/xla_cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
# 20 steps of 16 prompts from each seed's warm start; held-out greedy accuracy (256
# problems) every 5 steps.
SHORT="train.steps=20 train.eval_every=5 train.eval_samples=0 train.checkpoint_every=20"

sweep() {  # sweep ROW ARGS...: launch/sweep.py writing docs/reproductions/ROW.{md,png}
  local row="$1"; shift
  "$VENV/bin/python" launch/sweep.py --warm_start="$REPRO/arith_sft_seed{seed}" \
    --table="$DOCS/$row.md" --plot="$DOCS/$row.png" "$@"
}
