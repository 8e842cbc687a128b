"""W4 (shared/bench/workloads.md): the GAE kernel at B=64, T=8192, γ=1, λ=0.95.

Ours: `rlhf_jax.kernels.gae`, jitted, both recurrence methods, timed from
host arrays to advantages and returns on the host. Peers: the per-time-step
loop of verl's `compute_gae_advantage_return`, in NumPy and (when torch is
importable) in PyTorch on 2 threads. Prints one JSON line.

  python benchmarks/kernels.py [--repeats 5] [--threads 2]
  python benchmarks/kernels.py --tiny   (CI: B=4, T=256, one repeat; the same checks)
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

BATCH, TIME, GAMMA, LAM = 64, 8192, 1.0, 0.95


def w4_inputs():
  """W4's inputs, drawn in the order workloads.md lists them."""
  rng = np.random.default_rng(4)
  scores = rng.standard_normal(BATCH).astype(np.float32)
  values = rng.standard_normal((BATCH, TIME)).astype(np.float32)
  lengths = rng.integers(TIME // 8, TIME + 1, BATCH)  # 1024..8192 at W4's T
  mask = (np.arange(TIME)[None, :] < lengths[:, None]).astype(np.float32)
  rewards = np.zeros((BATCH, TIME), np.float32)
  rewards[np.arange(BATCH), lengths - 1] = scores
  return rewards, values, mask


def gae_loop_numpy(rewards, values, mask, gamma, lam):
  """verl's loop, transcribed to NumPy."""
  next_values = np.zeros(rewards.shape[0], np.float32)
  last_gae = np.zeros(rewards.shape[0], np.float32)
  reversed_advantages = []
  for t in reversed(range(rewards.shape[1])):
    delta = rewards[:, t] + gamma * next_values - values[:, t]
    last_gae_ = delta + gamma * lam * last_gae
    next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
    last_gae = last_gae_ * mask[:, t] + (1 - mask[:, t]) * last_gae
    reversed_advantages.append(last_gae)
  advantages = np.stack(reversed_advantages[::-1], axis=1)
  return advantages, advantages + values


def gae_loop_torch(torch, rewards, values, mask, gamma, lam):
  """verl's loop as verl writes it (torch, no_grad)."""
  with torch.no_grad():
    next_values = 0
    last_gae = 0
    reversed_advantages = []
    for t in reversed(range(rewards.shape[-1])):
      delta = rewards[:, t] + gamma * next_values - values[:, t]
      last_gae_ = delta + gamma * lam * last_gae
      next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
      last_gae = last_gae_ * mask[:, t] + (1 - mask[:, t]) * last_gae
      reversed_advantages.append(last_gae)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    return advantages, advantages + values


def timed(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return out, times


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--tiny", action="store_true", help="B=4, T=256, one repeat (CI)")
  args = parser.parse_args()
  if args.tiny:
    global BATCH, TIME  # pylint: disable=global-statement
    BATCH, TIME, args.repeats = 4, 256, 1
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import rlhf_jax
  from rlhf_jax import kernels

  loadavg_start = os.getloadavg()[0]
  rewards, values, mask = w4_inputs()
  result = {"workload": "w4_gae", "batch": BATCH, "time": TIME, "gamma": GAMMA, "lam": LAM,
            "repeats": args.repeats, "threads": args.threads, "loadavg_start": loadavg_start,
            "versions": {"python": platform.python_version(), "jax": jax.__version__,
                         "numpy": np.__version__, "rlhf_jax": rlhf_jax.__version__},
            "backend": jax.default_backend()}

  reference, numpy_times = timed(lambda: gae_loop_numpy(rewards, values, mask, GAMMA, LAM),
                                 args.repeats)
  result["numpy_loop_s"] = statistics.median(numpy_times)
  result["numpy_loop_runs_s"] = numpy_times

  for method in ("scan", "associative"):
    fn = jax.jit(lambda r, v, m, method=method: kernels.gae(r, v, m, gamma=GAMMA, lam=LAM,
                                                           method=method))
    start = time.perf_counter()
    jax.device_get(fn(rewards, values, mask))
    result[f"ours_{method}_compile_s"] = time.perf_counter() - start
    out, times = timed(lambda: jax.device_get(fn(rewards, values, mask)), args.repeats)
    np.testing.assert_allclose(out[0], reference[0] * mask, atol=2e-3, rtol=1e-4)
    result[f"ours_{method}_s"] = statistics.median(times)
    result[f"ours_{method}_runs_s"] = times
  best = min(("scan", "associative"), key=lambda m: result[f"ours_{m}_s"])
  result["ours_best_method"] = best
  result["ours_s"] = result[f"ours_{best}_s"]
  result["ratio_numpy_over_ours"] = result["numpy_loop_s"] / result["ours_s"]

  try:
    import torch
  except ImportError:
    result["torch_loop_s"] = None
    result["torch_skipped"] = "torch is not importable"
  else:
    torch.set_num_threads(args.threads)
    tensors = [torch.from_numpy(x) for x in (rewards, values, mask)]
    # Untimed warm-up: torch's first ops allocate and load kernels.
    gae_loop_torch(torch, *tensors, GAMMA, LAM)
    out, times = timed(lambda: gae_loop_torch(torch, *tensors, GAMMA, LAM), args.repeats)
    np.testing.assert_allclose(out[0].numpy(), reference[0], atol=1e-4)
    result["versions"]["torch"] = torch.__version__
    result["torch_loop_s"] = statistics.median(times)
    result["torch_loop_runs_s"] = times
    result["ratio_torch_over_ours"] = result["torch_loop_s"] / result["ours_s"]
  result["loadavg_end"] = os.getloadavg()[0]
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
