"""Routing replay against the trainer–sampler mismatch of a mixture-of-experts policy: a
bfloat16 sampler (as on a GPU) and a float32 trainer of the same random Qwen3-MoE.

Per seed: the sampler (bf16, recording routes) samples `--prompts` prompts × 4 at T = 1;
the trainer's float32 forward scores the sampled tokens twice, routing live ("off") and
replaying the sampler's routes ("R3", `algorithm.moe.routing_replay`). Reported per mode:
the route flip rate (the share of (token, layer) pairs whose expert set differs between
the sampler and the trainer's own router, `moe.route_flip_rate`), the mean k3 KL between
the sampler's and the trainer's token distributions at the sampled tokens
(exp(−Δ) − 1 + Δ, Δ = log π_trainer − log π_sampler) and max |Δ|, over every response
token. Prints one JSON line.

  python benchmarks/moe_replay.py [--seeds 3] [--prompts 16] [--new-tokens 48]
  python benchmarks/moe_replay.py --tiny   (CI: one seed, 4 prompts, 8 tokens)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

SHAPE = dict(vocab_size=512, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
             head_dim=32, intermediate_size=256, num_experts=32, experts_per_token=4,
             expert_intermediate_size=64)
TINY = dict(SHAPE, vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
            head_dim=16, num_experts=8, experts_per_token=2, expert_intermediate_size=16)


def measure(shape: dict, seed: int, prompts: int, new_tokens: int) -> dict:
  """One seed: the sampler's samples, then the trainer's two scorings of them."""
  import jax
  import jax.numpy as jnp
  from rlhf_jax import batch as batch_lib
  from rlhf_jax import models
  from rlhf_jax import sampling
  from rlhf_jax.models import moe
  from rlhf_jax.sampling.scheduler.scheduler import Scheduler

  config = models.DecoderConfig(architecture="qwen3_moe", qk_norm="head", qkv_bias=False,
                                normalize_expert_weights=True, **shape)
  trainer, params = models.init_model(config, seed=seed)
  sampler_model = models.with_numerics(trainer, dtype="bfloat16")
  rng = np.random.default_rng(seed)
  prompt_ids = [list(map(int, rng.integers(1, shape["vocab_size"], rng.integers(4, 17))))
                for _ in range(prompts)]
  engine = sampling.Engine(sampler_model, num_slots=16, cache_length=16 + new_tokens,
                           record_routes=True)
  done = Scheduler(engine, params, prompt_buckets=(16,)).generate(
      prompt_ids, sampling.SamplingParams(temperature=1.0, max_new_tokens=new_tokens, n=4,
                                          seed=seed))
  flat = [(p, c) for p, group in zip(prompt_ids, done) for c in group]
  batch = batch_lib.as_device(batch_lib.build_rollout_batch(
      [p for p, _ in flat], [c.token_ids for _, c in flat],
      [c.model_logprobs for _, c in flat], [0.0] * len(flat), [False] * len(flat),
      [i // 4 for i in range(len(flat))], prompt_length=16, response_length=new_tokens,
      pad_id=0, routes=[c.routes for _, c in flat]))
  mask = np.asarray(batch.response_mask) > 0
  sampler_logprobs = np.asarray(batch.sampler_logprobs)
  live_routes = np.asarray(jax.jit(lambda p, t, m: trainer.apply(
      p, t, attention_mask=m, with_routes=True)[2])(params, batch.tokens, batch.attention_mask))
  forward = jax.jit(lambda p, b: batch_lib.response_logprobs(trainer, p, b))
  out = {}
  for mode, scored in (("off", batch.replace(routes=None)), ("R3", batch)):
    delta = (np.asarray(forward(params, scored)) - sampler_logprobs)[mask]
    out[mode] = {"k3_kl": float(np.mean(np.exp(-delta) - 1 + delta)),
                 "max_abs_logprob_diff": float(np.max(np.abs(delta)))}
  # The trainer's live routes against the sampler's, over the response tokens.
  recorded = np.asarray(batch.routes)[:, 16:]
  flips = moe.route_flip_rate(jnp.asarray(recorded), jnp.asarray(live_routes[:, 16:]),
                              jnp.asarray(mask))
  out["off"]["route_flip_rate"] = float(np.mean(flips))
  out["R3"]["route_flip_rate"] = 0.0  # the trainer routes as the sampler did, by construction
  out["response_tokens"] = int(mask.sum())
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--prompts", type=int, default=16)
  parser.add_argument("--new-tokens", type=int, default=48)
  parser.add_argument("--tiny", action="store_true", help="one seed, toy sizes (CI)")
  args = parser.parse_args()
  shape = TINY if args.tiny else SHAPE
  seeds, prompts, new_tokens = ((1, 4, 8) if args.tiny else
                                (args.seeds, args.prompts, args.new_tokens))
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import rlhf_jax

  start = time.perf_counter()
  runs = [measure(shape, seed, prompts, new_tokens) for seed in range(seeds)]
  result = {"workload": "moe_replay", "shape": shape, "seeds": seeds, "prompts": prompts,
            "samples_per_prompt": 4, "new_tokens": new_tokens,
            "sampler_dtype": "bfloat16", "trainer_dtype": "float32", "per_seed": runs,
            "versions": {"python": platform.python_version(), "jax": jax.__version__,
                         "rlhf_jax": rlhf_jax.__version__}}
  for mode in ("off", "R3"):
    for key in ("k3_kl", "max_abs_logprob_diff", "route_flip_rate"):
      result[f"{mode}_{key}_mean"] = statistics.mean(r[mode][key] for r in runs)
  result["seconds"] = time.perf_counter() - start
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
