#!/usr/bin/env bash
# Xu et al. (2404.10719) factor 1: batch-whitened GAE advantages against raw ones.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep ppo_advantage_normalisation --config=configs/ppo.py:arith --root="$REPRO/ppo" \
  --set="$SHORT" --arm="ppo:" --arm="no-advantage-norm: algorithm.advantage.whiten=False" \
  --stat=gain:eval_accuracy --stat=final:eval_accuracy --stat=late_mean:accuracy \
  --plot_metrics=eval_accuracy,accuracy --title="PPO: advantage normalisation" "$@"
