#!/usr/bin/env bash
# DAPO §3.1: clip-higher (ε_low 0.2, ε_high 0.28) keeps the policy's entropy above
# symmetric clipping (0.2, 0.2). Extra arguments go to launch/sweep.py (e.g. --seeds=0).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep dapo_clip_higher --config=configs/dapo.py:arith --root="$REPRO/dapo" --set="$SHORT" \
  --arm="dapo:" --arm="symmetric-clip: algorithm.policy_loss.clip_high=0.2" \
  --stat=mean:entropy --stat=late_mean:entropy --stat=gain:eval_accuracy \
  --plot_metrics=entropy,eval_accuracy --title="DAPO: clip-higher vs symmetric clipping" "$@"
