#!/usr/bin/env bash
# VAPO §4.3: length-adaptive λ_actor = 1 − 1/(α·l), α 0.05, against a fixed λ_actor 0.95.
# Level-2 answers are the longer ones (45 to 57 tokens against 33).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep vapo_length_adaptive --config=configs/vapo.py:arith --root="$REPRO/vapo" --set="$SHORT" \
  --arm="vapo:" \
  --arm="fixed-lambda: algorithm.advantage.lam_schedule=fixed algorithm.advantage.actor_lam=0.95" \
  --stat=gain:eval_accuracy --stat=gain:eval_accuracy/L2 --stat=final:eval_accuracy \
  --plot_metrics=eval_accuracy,eval_accuracy/L2 \
  --title="VAPO: length-adaptive λ vs fixed λ 0.95" "$@"
