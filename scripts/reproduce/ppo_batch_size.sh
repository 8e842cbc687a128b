#!/usr/bin/env bash
# Xu et al. factor 2: a larger rollout batch: 16 prompts per step against 4 (× 4 samples;
# 2 updates per step in both arms).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep ppo_batch_size --config=configs/ppo.py:arith --root="$REPRO/ppo" --set="$SHORT" \
  --arm="ppo:" --arm="batch-4: rollout.prompts_per_step=4" \
  --stat=gain:eval_accuracy --stat=final:eval_accuracy --stat=seconds_to:eval_accuracy:0.1 \
  --plot_metrics=eval_accuracy,accuracy --title="PPO: batch size (prompts per step)" "$@"
