"""W1 (shared/bench/workloads.md) and a long-tail workload for the sampling engine.

W1: 32 prompts of 64 tokens, exactly 256 new tokens each at temperature 1 (EOS
ignored), KV cache; one untimed warm-up call, then timed calls with seeds 1, 2,
3, each from prompt ids on the host to all new ids on the host. The peer is
transformers `generate` (`shared/bench/run_hf.py --workloads w1`), run in the
same session, alternating with ours. The model FLOP rate is reported against
two limits measured in the same session: the square-GEMM peak and the
decode-shaped GEMM rate (32×512 @ 512×1408) of `shared/bench/matmul_peak.py`,
plus the same decode-shaped GEMM under XLA.

Long tail: 64 requests whose `max_new_tokens` are drawn from a log-normal
capped at 512 (EOS also stops), 32 slots, with and without continuous
batching: tokens/s and slot utilisation (emitted tokens / slot-steps).

  python benchmarks/sampling.py [--model-dir /tmp/bench_model] [--repeats 2]
      [--peer-python /tmp/venv_peers/bin/python] [--skip-peer] [--skip-long-tail]

Prints one JSON line per workload.

  python benchmarks/sampling.py --tiny   (CI: the same code on a 1-layer, 32-wide
      checkpoint of our own making, 4 prompts of 8 tokens, 8 new tokens, a long tail of
      8 requests of at most 16 tokens; the transformers peer is skipped and the record
      says so)
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

from common import BENCH
from common import default_peer_python
from common import ensure_bench_model
from common import peer_env
from common import peer_skipped
from common import run_json
from common import tiny_model_dir

N_PARAMS = 24_656_384
BATCH, PROMPT_LEN, NEW_TOKENS = 32, 64, 256
NOMINAL_FLOPS = 2 * N_PARAMS * BATCH * (PROMPT_LEN + NEW_TOKENS)  # workloads.md W1
LONG_TAIL_REQUESTS, LONG_TAIL_MEDIAN, LONG_TAIL_CAP = 64, 96, 512


def shrink_to_tiny(n_params: int) -> None:
  """--tiny: W1 and the long tail at toy sizes (the FLOPs of the tiny checkpoint's
  `n_params`)."""
  global N_PARAMS, BATCH, PROMPT_LEN, NEW_TOKENS, NOMINAL_FLOPS
  global LONG_TAIL_REQUESTS, LONG_TAIL_MEDIAN, LONG_TAIL_CAP
  N_PARAMS, BATCH, PROMPT_LEN, NEW_TOKENS = n_params, 4, 8, 8
  NOMINAL_FLOPS = 2 * N_PARAMS * BATCH * (PROMPT_LEN + NEW_TOKENS)
  LONG_TAIL_REQUESTS, LONG_TAIL_MEDIAN, LONG_TAIL_CAP = 8, 6, 16


def xla_decode_gemm_gflops(repeats: int = 200) -> float:
  """The decode-shaped GEMM (32×512 @ 512×1408, float32) under XLA, median GFLOP/s."""
  import jax
  import jax.numpy as jnp

  x = jnp.asarray(np.random.default_rng(0).standard_normal((32, 512), np.float32))
  w = jnp.asarray(np.random.default_rng(1).standard_normal((512, 1408), np.float32))
  matmul = jax.jit(lambda a, b: a @ b)
  matmul(x, w).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(x, w).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * 32 * 512 * 1408 / statistics.median(times) / 1e9


def load(model_dir: str):
  """(model, params) of the benchmark checkpoint."""
  from rlhf_jax import models

  return models.load_hf_checkpoint(model_dir)


def run_w1(model, params, prompts: np.ndarray, steps_per_sync: int) -> dict:
  """W1: a warm-up call, then three timed calls (seeds 1-3), host ids in → host ids out."""
  from rlhf_jax import sampling
  from rlhf_jax.sampling.scheduler.scheduler import Scheduler

  engine = sampling.Engine(model, num_slots=BATCH, cache_length=PROMPT_LEN + NEW_TOKENS)

  def once(seed: int) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    scheduler = Scheduler(engine, params, prompt_buckets=(PROMPT_LEN,),
                          steps_per_sync=steps_per_sync)
    params_list = [sampling.SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS,
                                           seed=seed * 1000 + row) for row in range(BATCH)]
    out = scheduler.generate(list(prompts), params_list)
    ids = np.asarray([samples[0].token_ids for samples in out], np.int32)
    return time.perf_counter() - start, ids

  warmup_s, ids = once(0)
  assert ids.shape == (BATCH, NEW_TOKENS), ids.shape
  times = []
  for seed in (1, 2, 3):
    elapsed, ids = once(seed)
    assert ids.shape == (BATCH, NEW_TOKENS)
    times.append(elapsed)
  return {"wall_s_runs": times, "warmup_s": warmup_s, "compilations": engine.compilations()}


def run_long_tail(model, params, continuous: bool, steps_per_sync: int) -> dict:
  """64 requests with log-normal max_new_tokens (median 96, capped at 512) on 32 slots,
  after warmup (`LONG_TAIL_*`, `BATCH` slots)."""
  from rlhf_jax import sampling
  from rlhf_jax.sampling.scheduler.scheduler import Scheduler

  rng = np.random.default_rng(7)
  requests = LONG_TAIL_REQUESTS
  lengths = np.minimum(np.round(rng.lognormal(mean=np.log(LONG_TAIL_MEDIAN), sigma=0.9,
                                              size=requests)), LONG_TAIL_CAP).astype(int)
  lengths = np.maximum(lengths, 1)
  prompts = rng.integers(3, model.config.vocab_size, size=(requests, PROMPT_LEN))
  engine = sampling.Engine(model, num_slots=BATCH, cache_length=PROMPT_LEN + LONG_TAIL_CAP)
  params_list = [sampling.SamplingParams(temperature=1.0, max_new_tokens=int(n),
                                         stop_token_ids=(0,), seed=i)
                 for i, n in enumerate(lengths)]
  scheduler = Scheduler(engine, params, prompt_buckets=(PROMPT_LEN,),
                        steps_per_sync=steps_per_sync, continuous=continuous)
  compiled = scheduler.warmup()  # compile every program the run can dispatch
  start = time.perf_counter()
  out = scheduler.generate(list(prompts), params_list)
  wall = time.perf_counter() - start
  assert engine.compilations() == compiled, "a program compiled inside the timed run"
  generated = sum(len(samples[0].token_ids) for samples in out)
  metrics = scheduler.metrics()
  return {"continuous": continuous, "wall_s": wall, "generated_tokens": generated,
          "tokens_per_s": generated / wall, "slot_utilisation": metrics["slot_utilisation"],
          "requested_lengths": {"mean": float(lengths.mean()), "max": int(lengths.max()),
                                "median": float(np.median(lengths))},
          "stopped_at_eos": sum(s[0].finish_reason == "stop" for s in out)}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model-dir", default="/tmp/bench_model")
  parser.add_argument("--peer-python", default=default_peer_python())
  parser.add_argument("--repeats", type=int, default=2,
                      help="alternating rounds of (ours, transformers), each warm-up + 3 calls")
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--steps-per-sync", type=int, default=32)
  parser.add_argument("--skip-peer", action="store_true")
  parser.add_argument("--skip-long-tail", action="store_true")
  parser.add_argument("--tiny", action="store_true",
                      help="a tiny checkpoint and workload, our side only (CI)")
  args = parser.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  env = peer_env(args.threads)
  notes = {}
  if args.tiny:
    args.model_dir = tiny_model_dir(args.model_dir, parser.get_default("model_dir"))
    args.skip_peer, args.repeats, args.steps_per_sync = True, 1, 4
    notes = peer_skipped("--tiny runs our side only (transformers' side is the full W1)")
  else:
    ensure_bench_model(args.peer_python, args.model_dir, "workload_inputs.npz", env)

  import jax

  import rlhf_jax
  if args.tiny:
    from rlhf_jax import models
    shrink_to_tiny(models.read_hf_config(args.model_dir).num_params())

  common = {"threads": args.threads, "backend": jax.default_backend(),
            "versions": {"python": platform.python_version(), "jax": jax.__version__,
                         "rlhf_jax": rlhf_jax.__version__}}
  model, params = load(args.model_dir)
  prompts = np.load(os.path.join(args.model_dir, "workload_inputs.npz"))["w1_prompt_ids"]
  result = {"workload": "W1_generate", "impl": "rlhf_jax", "batch": BATCH,
            "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS,
            "steps_per_sync": args.steps_per_sync, "loadavg_start": os.getloadavg()[0],
            **common, **notes}
  peaks = [] if args.skip_peer else run_json(
      [args.peer_python, str(BENCH / "matmul_peak.py"), "--threads", str(args.threads)], env)
  ours_runs, peer_runs, ratios = [], [], []
  for _ in range(args.repeats):
    ours = run_w1(model, params, prompts, args.steps_per_sync)
    ours_runs.append(ours)
    if not args.skip_peer:
      peer = run_json([args.peer_python, str(BENCH / "run_hf.py"), "--model-dir", args.model_dir,
                       "--threads", str(args.threads), "--workloads", "w1"], env)[0]
      peer_runs.append(peer)
      ratios.append(peer["wall_s_median"] / statistics.median(ours["wall_s_runs"]))
  all_ours = [t for run in ours_runs for t in run["wall_s_runs"]]
  median_s = statistics.median(all_ours)
  gflops = NOMINAL_FLOPS / median_s / 1e9
  decode_gemm = xla_decode_gemm_gflops()
  result.update(
      ours_wall_s_median=median_s, ours_wall_s_best=min(all_ours), ours_wall_s_runs=all_ours,
      ours_warmup_s=[r["warmup_s"] for r in ours_runs],
      ours_gen_tokens_per_s=BATCH * NEW_TOKENS / median_s, ours_model_gflops_per_s=gflops,
      compilations=ours_runs[-1]["compilations"], xla_decode_gemm_gflops=decode_gemm,
      ours_fraction_of_xla_decode_gemm=gflops / decode_gemm)
  if peer_runs:
    peer_all = [t for run in peer_runs for t in run["wall_s_runs"]]
    peer_s = statistics.median(peer_all)
    peak = max(p["torch_gflops_best"] for p in peaks)
    skinny = max(p["torch_skinny_32x512x1408_gflops_median"] for p in peaks)
    result.update(
        transformers_wall_s_median=peer_s, transformers_wall_s_runs=peer_all,
        transformers_gen_tokens_per_s=BATCH * NEW_TOKENS / peer_s,
        ratio_transformers_over_ours_per_round=ratios,
        ratio_transformers_over_ours=statistics.median(ratios),
        matmul_peak_gflops=peak, decode_gemm_gflops=skinny, matmul_peak=peaks,
        ours_fraction_of_matmul_peak=gflops / peak, ours_fraction_of_decode_gemm=gflops / skinny,
        transformers_fraction_of_matmul_peak=NOMINAL_FLOPS / peer_s / 1e9 / peak,
        versions={**result["versions"], "torch": peer_runs[0].get("torch"),
                  "transformers": peer_runs[0].get("transformers")})
  result["loadavg_end"] = os.getloadavg()[0]
  print(json.dumps(result), flush=True)

  if not args.skip_long_tail:
    for continuous in (True, False):
      line = {"workload": "long_tail_generate", "impl": "rlhf_jax",
              "requests": LONG_TAIL_REQUESTS,
              "num_slots": BATCH, "loadavg_start": os.getloadavg()[0], **common,
              **run_long_tail(model, params, continuous, min(args.steps_per_sync, 8))}
      print(json.dumps(line), flush=True)
  return 0


if __name__ == "__main__":
  os.environ.setdefault("RLHF_JAX_ORIGINAL_GLIBC_TUNABLES", os.environ.get("GLIBC_TUNABLES", ""))
  from rlhf_jax.runtime import keep_host_memory_resident
  keep_host_memory_resident()
  sys.exit(main())
