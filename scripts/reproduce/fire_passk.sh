#!/usr/bin/env bash
# FIRE (arXiv:2410.21236): pass@k of 16 samples at T=1 on 256 held-out level-1/2
# problems, regular sampling against a flaming-hot first token (T 30, top-k 16) and a hot
# first token of every line; for the three SFT warm starts and for the three DAPO
# policies of the dapo_* rows (run those first).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
passk() {  # passk NAME CHECKPOINTS
  "$VENV/bin/python" launch/eval.py --checkpoint="$2" --samples=16 --temperature=1.0 \
    --fire=none,first_token,every_line --arith_levels=1,2 --arith_count=256 \
    --table="$DOCS/$1.md" --plot="$DOCS/$1.png"
}
passk fire_passk_warm_start "$REPRO/arith_sft_seed0,$REPRO/arith_sft_seed1,$REPRO/arith_sft_seed2"
passk fire_passk_dapo "$REPRO/dapo/dapo/seed0/policy,$REPRO/dapo/dapo/seed1/policy,$REPRO/dapo/dapo/seed2/policy"
# The sandboxed code task: pycalc's warm start (programs run in the sandbox), 8 samples of
# 128 held-out problems of levels 1-3.
PYCALC="$REPRO/pycalc_sft"
if [ ! -f "$PYCALC/sft/config.json" ]; then
  "$VENV/bin/python" launch/sft.py --config=configs/pycalc.py:arith --workdir="$PYCALC"
fi
"$VENV/bin/python" -c "from rlhf_jax.tasks import pycalc; from rlhf_jax.data import write_examples; \
write_examples('$PYCALC/eval.jsonl', pycalc.examples(2, 128, (1, 2, 3), (1.0, 1.0, 1.0)))"
"$VENV/bin/python" launch/eval.py --checkpoint="$PYCALC/sft" --data="$PYCALC/eval.jsonl" \
  --samples=8 --temperature=1.0 --fire=none,first_token,every_line --max_new_tokens=24 \
  --table="$DOCS/fire_passk_pycalc.md"
