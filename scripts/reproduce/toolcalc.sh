#!/usr/bin/env bash
# The toolcalc task (docs/agents.md): per seed a warm start on tool-use and direct-answer
# demonstrations (configs/toolcalc.py), then GRPO over multi-turn episodes with the
# calculator; held-out greedy accuracy of whole episodes before and after RL, and how many
# model turns an episode takes (2: the model called the tool). Extra arguments go to
# launch/sweep.py (e.g. --seeds=0).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep toolcalc --config=configs/toolcalc.py --root="$REPRO/toolcalc" \
  --warm_start="$REPRO/toolcalc_sft_seed{seed}" --warm_start_config=configs/toolcalc.py \
  --arm="grpo:" --stat=final:eval_accuracy --stat=gain:eval_accuracy \
  --stat=final:eval_turns --stat=gain:eval_turns \
  --plot_metrics=eval_accuracy,eval_turns --title="toolcalc: GRPO learns to use the calculator" "$@"
