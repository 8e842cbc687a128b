#!/usr/bin/env bash
# VC-PPO §4: value pretraining (5 critic-only steps) with decoupled GAE (λ_critic 1,
# λ_actor 0.95) against plain PPO (no pretraining, one λ 0.95), at equal policy updates:
# VC-PPO runs 25 steps (5 critic-only + 20 updates), PPO 20. The paper reports PPO's
# response length collapsing from a reward-model-initialised critic.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep vcppo_value_pretraining --config=configs/vcppo.py:arith --root="$REPRO/vcppo" \
  --set="$SHORT" --arm="vc-ppo: train.steps=25" \
  --arm="ppo: algorithm.value.pretrain_steps=0 algorithm.advantage.critic_lam=0.95" \
  --stat=late_mean:response_length_mean --stat=final:eval_accuracy --stat=gain:eval_accuracy \
  --plot_metrics=response_length_mean,eval_accuracy \
  --title="VC-PPO (5 + 20 steps): value pretraining + decoupled λ vs PPO (20 steps)" "$@"
