#!/usr/bin/env bash
# DAPO §3.3: the token-level loss (token-mean) weighs every token equally, so long wrong
# answers are penalised in full; the sample-level loss (seq-mean-token-mean) gives each
# response one share, letting long wrong answers grow.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sweep dapo_token_mean --config=configs/dapo.py:arith --root="$REPRO/dapo" --set="$SHORT" \
  --arm="dapo:" --arm="sample-mean: algorithm.policy_loss.agg=seq-mean-token-mean" \
  --stat=late_mean:response_length_wrong_mean --stat=late_mean:entropy \
  --stat=gain:eval_accuracy \
  --plot_metrics=response_length_wrong_mean,entropy,eval_accuracy \
  --title="DAPO: token-mean vs sample-mean loss" "$@"
