#!/usr/bin/env bash
# Xu et al. factor 2: a larger rollout batch: 4, 16 (the preset) and 32 prompts per step
# (× 4 samples; 2 updates per step in every arm, so the mini-batches grow with the batch).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep ppo_batch_size --config=configs/ppo.py:arith --root="$REPRO/ppo" --set="$SHORT" \
  --arm="batch-4: rollout.prompts_per_step=4" --arm="ppo:" \
  --arm="batch-32: rollout.prompts_per_step=32" \
  --stat=gain:eval_accuracy --stat=final:eval_accuracy --stat=seconds_to:eval_accuracy:0.1 \
  --plot_metrics=eval_accuracy,accuracy --title="PPO: batch size (prompts per step)" "$@"
