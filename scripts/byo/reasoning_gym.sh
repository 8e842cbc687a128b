#!/usr/bin/env bash
# A worked example of "bring your own" (docs/byo.md): a reasoning-gym dataset in TRL's
# layout, its own scoring function as reward.function, a warm start from scratch on its
# conversations (launch/sft.py hf), then DAPO from that checkpoint, on a CPU in minutes.
#   bash scripts/byo/reasoning_gym.sh [--config.train.steps=40 ...]   (flags go to train.py)
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
ensure_venv hf
"$VENV/bin/python" -m pip install -q --disable-pip-version-check reasoning-gym
cd "$ROOT"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
OUT="${RLHF_JAX_RUNS:-runs}/byo-reasoning-gym"
MODEL=(--config.model.hidden_size=128 --config.model.num_layers=3 --config.model.num_heads=4
       --config.data.prompt_length=48 --config.sampler.prompt_buckets=48
       --config.sampler.cache_length=64 --config.rollout.max_new_tokens=8
       --config.sampler.num_slots=64 --config.model.logprob_chunk=0)
"$VENV/bin/python" scripts/byo/reasoning_gym_data.py --out="$OUT/data"
"$VENV/bin/python" launch/sft.py --config=configs/sft.py:hf --workdir="$OUT" --overwrite \
  --config.sft.train_file="$OUT/data/sft.jsonl" --config.sft.steps=600 \
  --config.sft.batch_size=64 --config.sft.learning_rate=3e-3 --config.sft.vocab_size=320 \
  "${MODEL[@]}"
"$VENV/bin/python" launch/train.py --config=configs/dapo.py:hf --workdir="$OUT/rl" \
  --config.model.checkpoint="$OUT/sft" --config.data.train_file="$OUT/data/train.jsonl" \
  --config.data.eval_file="$OUT/data/eval.jsonl" --config.data.default_task=basic_arithmetic \
  --config.reward.function=scripts/byo/rg_reward.py:rg_score \
  --config.rollout.prompts_per_step=16 --config.rollout.group_size=8 \
  --config.optimizer.learning_rate=1e-4 --config.optimizer.warmup_steps=5 \
  --config.optimizer.schedule=cosine --config.optimizer.weight_decay=0.0 \
  --config.algorithm.overlong.penalty=False \
  --config.train.steps=60 --config.train.eval_every=20 --config.train.eval_samples=4 \
  "${MODEL[@]}" "$@"
