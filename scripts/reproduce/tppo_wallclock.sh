#!/usr/bin/env bash
# T-PPO: windowed generation (32 new tokens per response per step, Extended GAE) against
# PPO that waits for whole responses, in training seconds to the same held-out gain. The
# lengths are long-tailed: levels 1, 2, 3 at 2:2:1 (worked solutions 21 to 69 tokens, the
# warm start never saw level 3) under a 96-token cap. A third arm gives T-PPO's critic 5
# steps of pretraining (counted in the 20): unfinished rows' advantages rest on its values.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
TAIL="data.levels=(1,2,3) data.level_weights=(2.0,2.0,1.0)"
sweep tppo_wallclock --config=configs/tppo.py:arith --root="$REPRO/tppo" --set="$SHORT $TAIL" \
  --arm="t-ppo:" --arm="ppo: rollout.mode=groups" \
  --arm="t-ppo-value-pretrained: algorithm.value.pretrain_steps=5" \
  --stat=seconds_to:eval_accuracy:0.1 --stat=steps_to:eval_accuracy:0.1 \
  --stat=gain:eval_accuracy --stat=final:eval_accuracy --stat=mean:response_length_max \
  --stat=mean:time_generate --stat=mean:time_update --x=seconds \
  --plot_metrics=eval_accuracy,response_length_max \
  --title="T-PPO vs PPO on long-tailed lengths (x: training seconds)" "$@"
