#!/usr/bin/env bash
# VAPO §4.6: the NLL on correct samples (μ 0.1) against none.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep vapo_positive_nll --config=configs/vapo.py:arith --root="$REPRO/vapo" --set="$SHORT" \
  --arm="vapo:" --arm="no-positive-nll: algorithm.policy_loss.positive_nll_coef=0.0" \
  --stat=gain:eval_accuracy --stat=final:eval_accuracy --stat=late_mean:entropy \
  --plot_metrics=eval_accuracy,accuracy,entropy --title="VAPO: positive-example NLL" "$@"
