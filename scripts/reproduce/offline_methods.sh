#!/usr/bin/env bash
# Offline and inference-time methods on arith from the seed-0 warm start:
#   DPO (offline pairs of the warm start's verified samples) and DQO (its labelled samples),
#   two learning rates each, iterative DPO, against PPO and GRPO; held-out greedy accuracy every 5 steps;
#   speculative rejection against Best-of-N by the BT reward model and by the PRM of
#   reward_hacking.sh (run it first); Q♯ against π_ref and Best-of-N.
# Writes docs/reproductions/offline_methods.md (~25 min on 2 cores).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT="$REPRO/offline"
WARM="$REPRO/arith_sft_seed0"
RM="$REPRO/rewards"
mkdir -p "$OUT"
py() { "$VENV/bin/python" "$@"; }
if [ ! -f "$WARM/config.json" ]; then
  py launch/sft.py --config=configs/dapo.py:arith --workdir="$REPRO/ws0"
  mv "$REPRO/ws0/sft" "$WARM"
fi
# Warm starts saved before the character tokenizer learnt "\n\n" cannot re-encode
# sampled text; re-saving it is harmless (the vocabulary is the same).
py -c "from rlhf_jax.tasks import arith; arith.tokenizer().save('$WARM')"
for model in rm prm; do
  [ -f "$RM/$model/config.json" ] && py -c "from rlhf_jax.tasks import arith; arith.tokenizer().save('$RM/$model')"
done
LABELLED="$OUT/labelled_seed0.jsonl"
[ -f "$LABELLED" ] || py launch/label_samples.py --config=configs/dqo.py:arith \
  --config.model.checkpoint="$WARM" --output="$LABELLED" --pairs_output="$OUT/pairs_seed0.jsonl"
COMMON=(--config.model.checkpoint="$WARM" --config.train.eval_every=5
        --config.train.eval_samples=0 --config.train.loggers=)
train() {  # train NAME PRESET ARGS...
  local name="$1" preset="$2"; shift 2
  [ -f "$OUT/$name/policy/config.json" ] || py launch/train.py --config="configs/$preset.py:arith" \
    --workdir="$OUT/$name" "${COMMON[@]}" "$@" > "$OUT/$name.log" 2>&1
}
train dpo dpo --config.data.offline_file="$LABELLED" --config.train.steps=60  # lr 3e-5
train dpo_lr1e-4 dpo --config.data.offline_file="$LABELLED" --config.train.steps=60 \
  --config.optimizer.learning_rate=1e-4
train iterative_dpo iterative_dpo --config.train.steps=30
train dqo dqo --config.data.offline_file="$LABELLED" --config.train.steps=60  # lr 3e-5
train dqo_lr2e-4 dqo --config.data.offline_file="$LABELLED" --config.train.steps=60 \
  --config.optimizer.learning_rate=2e-4 --config.optimizer.critic_learning_rate=1e-3
train ppo ppo --config.train.steps=30
train grpo grpo --config.train.steps=30
BON=(--config=configs/ppo.py:arith --config.model.checkpoint="$WARM" --config.train.loggers=
     --prompts=128 --n=16 --rejection_rate=0.5)
if [ -f "$RM/rm/config.json" ]; then
  py launch/best_of_n.py "${BON[@]}" --config.reward.route=rm --config.reward.rm.checkpoint="$RM/rm" \
    --decision_tokens=8,16 --compare --bon_n=4,8,12 | grep '^{' > "$OUT/bon_rm.jsonl"
  py launch/best_of_n.py "${BON[@]}" --config.reward.route=rm --config.reward.rm.checkpoint="$RM/rm" \
    --decision_tokens=24 | grep '^{' >> "$OUT/bon_rm.jsonl"
fi
if [ -f "$RM/prm/config.json" ]; then
  py launch/best_of_n.py "${BON[@]}" --prm="$RM/prm" --decision_tokens=8,16 --compare \
    --bon_n=8 | grep '^{' > "$OUT/bon_prm.jsonl"
fi
QS=(--config=configs/ppo.py:arith --config.model.checkpoint="$WARM" --config.train.loggers=
    --config.sampler.prompt_buckets=64,127 --rounds=3 --prompts_per_round=256 --samples=4
    --steps=300 --eval_samples=4)
BON_RM=()
[ -f "$RM/rm/config.json" ] && BON_RM=(--config.reward.route=rm --config.reward.rm.checkpoint="$RM/rm" --bon_n=4,16)
py launch/qsharp.py "${QS[@]}" --eta=0.1 "${BON_RM[@]}" --output="$OUT/qsharp_guide.npz" | grep '^{' > "$OUT/qsharp.jsonl"
py launch/qsharp.py "${QS[@]}" --eta=1.0 | grep '^{' | grep -v '"reference"' >> "$OUT/qsharp.jsonl"
py scripts/reproduce/offline_methods_table.py "$OUT" > "$DOCS/offline_methods.md"
cat "$DOCS/offline_methods.md"
