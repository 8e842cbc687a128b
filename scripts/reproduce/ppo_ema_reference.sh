#!/usr/bin/env bash
# Xu et al. factor 3: the KL reference follows the actor, ref ← (1−η)·ref + η·actor after
# each step. η 0.05 here: ReaLHF's 0.001 would not move the reference in 20 steps.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep ppo_ema_reference --config=configs/ppo.py:arith --root="$REPRO/ppo" --set="$SHORT" \
  --arm="ppo:" --arm="ema-reference: algorithm.kl.reference_ema=0.05" \
  --stat=gain:eval_accuracy --stat=final:eval_accuracy --stat=late_mean:rollout_kl \
  --plot_metrics=eval_accuracy,rollout_kl --title="PPO: EMA reference" "$@"
