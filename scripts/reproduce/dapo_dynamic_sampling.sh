#!/usr/bin/env bash
# DAPO §3.2: dynamic sampling (keep groups with 0 < #correct < G, over-sample to fill the
# batch) reaches a target held-out accuracy in fewer updates than plain groups, where
# all-right and all-wrong groups carry no gradient. Arms: verl's semantics (surplus
# qualified groups discarded, the preset's default), OpenRLHF's (surplus kept for later
# steps, at most 3 policy versions old, corrected by decoupled PPO), and plain groups.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep dapo_dynamic_sampling --config=configs/dapo.py:arith --root="$REPRO/dapo" --set="$SHORT" \
  --arm="dapo:" \
  --arm="dapo-keep-surplus: rollout.dynamic.keep_surplus=True rollout.dynamic.max_age=3" \
  --arm="no-dynamic-sampling: rollout.mode=groups" \
  --stat=steps_to:eval_accuracy:0.15 --stat=seconds_to:eval_accuracy:0.15 \
  --stat=final:eval_accuracy --stat=late_mean:staleness/stale_token_fraction \
  --plot_metrics=eval_accuracy,accuracy \
  --title="DAPO: dynamic sampling (verl: discard; kept surplus) vs plain groups" "$@"
