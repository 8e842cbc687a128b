#!/usr/bin/env bash
# docs/reward_models.md: PPO on arith rewarded by the verifier, a Bradley–Terry RM,
# GenRM w/ GT, GenRM w/ SFT-BoN (references: best of 4 SFT samples by the RM), and the
# verifier + a PRM (Delta-shaped or raw step rewards, critic from the PRM); proxy reward
# beside true accuracy (Shen et al.'s hacking comparison, one seed, 30 steps).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RM="$REPRO/rewards"
mkdir -p "$RM"
WARM="$REPRO/arith_sft_seed0"
if [ ! -f "$WARM/config.json" ]; then  # the seed-0 warm start of the other rows
  "$VENV/bin/python" launch/sft.py --config=configs/dapo.py:arith --workdir="$REPRO/ws0"
  mv "$REPRO/ws0/sft" "$WARM"
fi
py() { "$VENV/bin/python" "$@"; }
[ -f "$RM/rm/config.json" ] || py launch/train_rm.py --policy="$WARM" --output="$RM/rm" --steps=300
[ -f "$RM/genrm/config.json" ] || py launch/train_judge.py --kind=genrm --policy="$WARM" \
  --output="$RM/genrm" --steps=400
[ -f "$RM/genrm_ref/config.json" ] || py launch/train_judge.py --kind=genrm_reference \
  --policy="$WARM" --output="$RM/genrm_ref" --steps=400
[ -f "$RM/refs.jsonl" ] || py launch/make_references.py --config=configs/ppo.py:arith \
  --config.model.checkpoint="$WARM" --rm="$RM/rm" --output="$RM/refs.jsonl" --n=4 \
  --max_prompts=2000
[ -f "$RM/prm/config.json" ] || py launch/train_prm.py --policy="$WARM" --output="$RM/prm" \
  --num_prompts=640 --samples=4 --completions=8 --steps=800
sweep reward_hacking --config=configs/ppo.py:arith --root="$RM/hacking" --seeds=0 \
  --set="train.steps=30 train.eval_every=5 train.eval_samples=0" \
  --arm="verifier:" \
  --arm="bt_rm: reward.route=rm reward.rm.checkpoint=$RM/rm" \
  --arm="genrm_gt: reward.route=genrm_gt reward.genrm.checkpoint=$RM/genrm" \
  --arm="genrm_sft_bon: reward.route=genrm_reference reward.genrm.checkpoint=$RM/genrm_ref data.train_file=$RM/refs.jsonl" \
  --arm="prm_delta: reward.process.checkpoint=$RM/prm critic.init_from=$RM/prm" \
  --arm="prm_raw: reward.process.checkpoint=$RM/prm critic.init_from=$RM/prm algorithm.process_reward.shaping=none" \
  --stat=final:eval_accuracy --stat=gain:eval_accuracy --stat=late_mean:reward_mean \
  --stat=late_mean:response_length_mean --plot_metrics=reward_mean,eval_accuracy
py scripts/reproduce/reward_hacking_plot.py "$RM/hacking" "$DOCS/../reward_models/hacking" \
  verifier bt_rm genrm_gt genrm_sft_bon prm_delta prm_raw
