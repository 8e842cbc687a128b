#!/usr/bin/env bash
# Every row of docs/reproductions.md in turn (about 1 h 30 min on 2 CPU cores, plus ~9 min
# for the three SFT warm starts when they are missing);
# a finished run is reused, so a stopped sweep picks up where it was. Extra arguments go
# to every row (e.g. --seeds=0 for a quick pass).
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
for row in dapo_clip_higher dapo_dynamic_sampling dapo_token_mean dapo_overlong \
    vapo_length_adaptive vapo_positive_nll vcppo_value_pretraining \
    ppo_advantage_normalisation ppo_ema_reference ppo_batch_size tppo_wallclock fire_passk; do
  echo "=== $row"
  bash "$HERE/$row.sh" "$@"
done
