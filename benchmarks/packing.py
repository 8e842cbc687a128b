"""A GRPO learner step (prepare + actor update) on log-normal response lengths: rows
packed into token buffers (`train.packing`) against padded rows, same run, alternating.

Workload: B = 64 rows (8 prompts × 8), prompts of 16-64 tokens (bucket 64), responses
log-normal (median 96 tokens, σ = 0.8) capped at R = 512, on a 4-layer, 256-wide
decoder (vocabulary 4096, float32). One epoch, 2 mini-batches, 2 micro-batches.
Tokens/s counts real prompt + response tokens of the step; the padding fractions are
the learner's own metrics.

  python benchmarks/packing.py [--repeats 4] [--warmup 2] [--rows 64] [--response 512]
  python benchmarks/packing.py --tiny   (CI: 16 rows of up to 64 tokens, a 1-layer 32-wide
                                         decoder, 1 + 2 steps)

Steps that compiled a new program (a new buffer count) are not timed. Prints one
JSON line: per mode the median step time, tokens/s and padding fraction,
and the packed / padded speed ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = dict(vocab_size=4096, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
             head_dim=64, intermediate_size=768)


def make_learner(packed: bool, minibatches: int, micro_batches: int):
  """A GRPO PPOLearner (actor only) on a fresh 4-layer model (`MODEL`)."""
  import jax

  from rlhf_jax import models
  from rlhf_jax import optim
  from rlhf_jax import parallel
  from rlhf_jax.algorithms import ppo_learner
  from rlhf_jax.algorithms.row_packer import RowPacker
  from rlhf_jax.training.config import sibling_preset

  c = sibling_preset(str(ROOT / "configs" / "grpo.py"), "grpo", "arith")
  c.train.minibatches, c.train.micro_batches = minibatches, micro_batches
  c.algorithm.kl.placement = "none"
  c.algorithm.overlong.penalty = False
  config = models.DecoderConfig(**MODEL)
  model, params = models.init_model(config, seed=0)
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  actor = ppo_learner.actor_role(model, params, optim.make_optimizer(1e-6, max_grad_norm=1.0),
                                 mesh, c.algorithm, c.train)
  return ppo_learner.PPOLearner(c.algorithm, actor, None, None, correction="none",
                                group_size=8, seed=0,
                                packing=RowPacker(minibatches, micro_batches) if packed else None)


def make_batch(seed: int, rows: int, response: int):
  """A rollout batch with log-normal response lengths and ragged prompts."""
  import numpy as np

  from rlhf_jax import batch as batch_lib

  rng = np.random.default_rng(seed)
  lengths = np.clip(np.round(rng.lognormal(np.log(96), 0.8, rows)), 1, response).astype(int)
  prompts = [list(rng.integers(3, 4096, rng.integers(16, 65))) for _ in range(rows)]
  responses = [list(rng.integers(3, 4096, n)) for n in lengths]
  host = batch_lib.build_rollout_batch(
      prompts, responses, [list(-rng.uniform(1, 3, n)) for n in lengths],
      list(rng.choice([0.0, 1.0], rows)), [False] * rows, list(np.arange(rows) // 8),
      prompt_length=64, response_length=response, pad_id=0)
  real = sum(len(p) for p in prompts) + int(lengths.sum())
  return batch_lib.as_device(host), real


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=4)
  parser.add_argument("--warmup", type=int, default=2, help="steps not timed (compiles)")
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--response", type=int, default=512)
  parser.add_argument("--tiny", action="store_true", help="toy sizes (CI)")
  args = parser.parse_args()
  if args.tiny:
    args.rows, args.response, args.repeats, args.warmup = 16, 64, 2, 1
    MODEL.update(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                 intermediate_size=64)
  import jax

  learners = {mode: make_learner(mode == "packed", 2, 2) for mode in ("padded", "packed")}
  times = {mode: [] for mode in learners}
  padding = {}
  tokens = []
  compiled = {mode: 0 for mode in learners}
  programs = lambda learner: learner._prepare._cache_size() + learner.actor._update._cache_size()
  for step in range(args.repeats + args.warmup):
    batch, real = make_batch(step, args.rows, args.response)
    for mode, learner in learners.items():
      before = programs(learner)
      start = time.perf_counter()
      out = jax.block_until_ready(learner.learn(batch, step))
      seconds = time.perf_counter() - start
      if programs(learner) > before:  # a new buffer count compiled: not a steady step
        compiled[mode] += 1
      elif step >= args.warmup:
        times[mode].append(seconds)
        tokens.append(real)
        if mode == "packed":
          padding = out["learner"]
  result = {"workload": "packing_grpo_step", "backend": jax.default_backend(),
            "rows": args.rows, "response_length": args.response,
            "real_tokens_per_step": statistics.median(tokens),
            "steps_timed": {mode: len(runs) for mode, runs in times.items()},
            "steps_that_compiled": compiled}
  if not all(times.values()):  # every step compiled a new program: nothing steady to time
    result["note"] = "no steady step was timed: raise --repeats"
    print(json.dumps(result))
    return 0
  for mode, runs in times.items():
    result[f"{mode}_s_median"] = statistics.median(runs)
    result[f"{mode}_tokens_per_s"] = statistics.median(tokens) / statistics.median(runs)
  result.update(padding)
  result["speedup_packed_over_padded"] = result["padded_s_median"] / result["packed_s_median"]
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, str(ROOT))
  sys.exit(main())
