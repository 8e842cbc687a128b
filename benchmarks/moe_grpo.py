"""Routing replay in a GRPO run of a mixture-of-experts policy: a bfloat16 sampler (as on a
GPU) and a float32 trainer of the same random Qwen3-MoE, trained a few steps with
`algorithm.moe.routing_replay` off, R2 and R3, over several seeds.

Each run is the trainer's own loop (`training.loop.Trainer.train_step`) on a tiny random
Qwen3-MoE checkpoint written by `models.save_hf_checkpoint` with a BPE tokenizer: prompts of
random words, reward 1 when the completion holds the prompt's first letter, two mini-batches
per step (so R2's replay reaches the second one after the weights moved). Per step, from the
step's metrics: `moe/route_flip_rate` (sampler's routes against the trainer's live router;
recorded under off and R2 by `measure_route_flips`), `logprob_mismatch_mean` and
`logprob_mismatch_k3` (the trainer's π_old against the sampler's log-probs), and
`update_logprob_gap_max` (|log π − log π_old| in the updates), and the step's seconds.
Prints one JSON line: per mode and seed the per-step values, and per mode the means over
steps and seeds.

  python benchmarks/moe_grpo.py [--seeds 3] [--steps 6]
  python benchmarks/moe_grpo.py --tiny   (one seed, one step: CI)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

MODES = ("off", "R2", "R3")
KEYS = ("moe/route_flip_rate", "logprob_mismatch_mean", "logprob_mismatch_k3",
        "update_logprob_gap_max", "reward_mean", "step_s")
WORDS = ("apple banana cherry delta eagle falcon garden harbor island jungle kettle lemon "
         "mango nectar orange pepper quartz river salmon tiger").split()


def write_checkpoint(directory: str, seed: int) -> None:
  """A random Qwen3-MoE (4 layers, 16 experts, 4 per token) with a BPE tokenizer."""
  from rlhf_jax import models

  tokenizer = models.train_bpe_tokenizer([" ".join(WORDS)] * 40, vocab_size=160)
  tokenizer.save(directory)
  config = models.DecoderConfig(
      architecture="qwen3_moe", qk_norm="head", qkv_bias=False, normalize_expert_weights=True,
      vocab_size=tokenizer.vocab_size, hidden_size=64, num_layers=4, num_heads=4,
      num_kv_heads=2, head_dim=16, intermediate_size=128, num_experts=16, experts_per_token=4,
      expert_intermediate_size=32)
  model, params = models.init_model(config, seed=seed)
  models.save_hf_checkpoint(directory, model, params,
                            token_ids={"eos_token_id": tokenizer.eos_id,
                                       "pad_token_id": tokenizer.pad_id})


def first_letter(response: str, answer: str) -> bool:
  """The reward: the completion holds the letter the prompt starts with."""
  return answer in response


def run(mode: str, seed: int, steps: int, model_dir: str, train_file: str) -> dict:
  """One GRPO run: `steps` steps' metrics."""
  import importlib.util

  from rlhf_jax.rewards import RewardRouter
  from rlhf_jax.training.loop import Trainer

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location("grpo", os.path.join(root, "configs",
                                                                     "grpo.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("hf")
  c.seed = seed
  c.model.checkpoint, c.model.dtype, c.sampler.dtype = model_dir, "float32", "bfloat16"
  c.data.train_file, c.data.prompt_length, c.data.shuffle = train_file, 48, False
  c.rollout.prompts_per_step, c.rollout.group_size, c.rollout.max_new_tokens = 8, 4, 24
  c.sampler.num_slots, c.sampler.cache_length, c.sampler.prompt_buckets = 32, 72, (48,)
  c.sampler.warmup = False
  c.train.steps, c.train.epochs, c.train.minibatches = steps, 1, 2
  c.train.eval_every, c.train.loggers, c.train.log_rollouts = 0, "", 0
  c.optimizer.learning_rate, c.optimizer.warmup_steps = 3e-4, 1
  c.algorithm.kl.placement, c.algorithm.kl.coef = "none", 0.0
  c.algorithm.moe.routing_replay = mode
  c.algorithm.moe.measure_route_flips = mode != "R3"
  c.reward.correct_score, c.reward.wrong_score = 1.0, 0.0
  with tempfile.TemporaryDirectory() as workdir:
    scorer = RewardRouter({"letters": first_letter}, correct_score=1.0, wrong_score=0.0)
    trainer = Trainer(c, workdir, log=lambda line: None, scorer=scorer)
    out = {key: [] for key in KEYS}
    for _ in range(steps):
      start = time.perf_counter()
      metrics = trainer.train_step()
      metrics["step_s"] = time.perf_counter() - start
      for key in KEYS:
        out[key].append(float(metrics.get(key, float("nan"))))
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--tiny", action="store_true", help="one seed, one step (CI)")
  args = parser.parse_args()
  seeds, steps = (1, 1) if args.tiny else (args.seeds, args.steps)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import rlhf_jax

  start = time.perf_counter()
  rng = np.random.default_rng(0)
  result = {"workload": "moe_grpo", "seeds": seeds, "steps": steps,
            "sampler_dtype": "bfloat16", "trainer_dtype": "float32", "runs": {}}
  with tempfile.TemporaryDirectory() as scratch:
    train_file = os.path.join(scratch, "letters.jsonl")
    with open(train_file, "w", encoding="utf-8") as f:
      for _ in range(64):
        words = " ".join(rng.choice(WORDS, 3))
        f.write(json.dumps({"prompt": words, "answer": words[0], "task": "letters"}) + "\n")
    for seed in range(seeds):
      model_dir = os.path.join(scratch, f"model{seed}")
      os.makedirs(model_dir)
      write_checkpoint(model_dir, seed)
      for mode in MODES:
        result["runs"].setdefault(mode, []).append(run(mode, seed, steps, model_dir,
                                                       train_file))
        print(f"seed {seed} {mode} done at {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
  for mode, runs in result["runs"].items():
    for key in KEYS:
      values = [v for r in runs for v in r[key][1:] if v == v]  # the first step compiles
      result[f"{mode}_{key}_mean"] = statistics.mean(values) if values else None
  result["versions"] = {"python": platform.python_version(), "jax": jax.__version__,
                        "rlhf_jax": rlhf_jax.__version__}
  result["seconds"] = time.perf_counter() - start
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
