"""W2 (shared/bench/workloads.md): one PPO-clip training step on the benchmark checkpoint.

Ours: forward (LM head on the 257 response-predicting positions only) →
`token_logprobs` → `ppo_policy_loss` (token-mean) → backward → global-norm clip
1.0 → AdamW (optax), one jitted function with donated parameters and
optimizer state; the loss comes back to the host every step. The peer is the
PyTorch eager step of `shared/bench/run_hf.py --workloads w2`, run in the same
session (alternating with ours), and the float32 GEMM peak of
`shared/bench/matmul_peak.py` is measured in the same session for MFU.
Prints one JSON line. The process re-executes itself once with glibc malloc
tunables that keep XLA:CPU's temporary buffer resident (`rlhf_jax/runtime.py`);
the peer keeps its own environment unless --peer-resident-malloc.

  python benchmarks/train_step.py [--model-dir /tmp/bench_model] [--repeats 2]
      [--peer-python /tmp/venv_peers/bin/python] [--skip-peer] [--dtype float32]
  python benchmarks/train_step.py --tiny   (CI: the same step on a 1-layer, 32-wide
      checkpoint of our own making, 4 rows of 8 + 8 tokens, 1 warm-up and 1 timed step;
      the PyTorch peer is skipped and the record says so)
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

PROMPT_LEN, BATCH, SEQ = 64, 16, 320
CLIP_EPS, LR, MAX_GRAD_NORM = 0.2, 1e-6, 1.0
NOMINAL_FLOPS = 6 * 24_656_384 * BATCH * SEQ  # 6N per token (workloads.md)
WARMUP, TIMED = 2, 5  # steps per round


def shrink_to_tiny(n_params: int) -> None:
  """--tiny: W2 at toy sizes (the FLOPs of the tiny checkpoint's `n_params`)."""
  global PROMPT_LEN, BATCH, SEQ, NOMINAL_FLOPS, WARMUP, TIMED
  PROMPT_LEN, BATCH, SEQ, WARMUP, TIMED = 8, 4, 16, 1, 1
  NOMINAL_FLOPS = 6 * n_params * BATCH * SEQ


def build_step(model):
  """The jitted W2 step: (params, opt_state, batch) -> (params, opt_state, loss)."""
  import jax
  import jax.numpy as jnp
  import optax

  from rlhf_jax import kernels

  optimizer = optax.chain(
      optax.clip_by_global_norm(MAX_GRAD_NORM),
      optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))
  response = SEQ - PROMPT_LEN

  def loss_fn(params, batch):
    logits, _ = model.apply(params, batch["input_ids"], num_last=response + 1)
    logprobs = kernels.token_logprobs(logits[:, :-1], batch["input_ids"][:, PROMPT_LEN:])
    advantages = jnp.broadcast_to(batch["advantages"][:, None], logprobs.shape)
    loss, _ = kernels.ppo_policy_loss(logprobs, batch["old_logprobs"], advantages,
                                      batch["loss_mask"][:, PROMPT_LEN:], clip_low=CLIP_EPS,
                                      agg="token-mean")
    return loss

  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return optimizer, jax.jit(step, donate_argnums=(0, 1))


def run_ours(model_dir: str, dtype: str, warmup: int | None = None,
             timed: int | None = None) -> dict:
  """W2: compile, `warmup` untimed steps, `timed` timed steps; per-step times and losses."""
  import jax

  from rlhf_jax import models

  warmup = WARMUP if warmup is None else warmup
  timed = TIMED if timed is None else timed
  overrides = {} if dtype == "float32" else {"dtype": dtype}
  model, params = models.load_hf_checkpoint(model_dir, **overrides)
  inputs = np.load(os.path.join(model_dir, "workload_inputs.npz"))
  batch = {"input_ids": inputs["w2_input_ids"], "advantages": inputs["w2_advantages"],
           "old_logprobs": inputs["w2_old_logprobs"], "loss_mask": inputs["w2_loss_mask"]}
  optimizer, step = build_step(model)
  opt_state = optimizer.init(params)
  start = time.perf_counter()
  compiled = step.lower(params, opt_state, batch).compile()
  compile_s = time.perf_counter() - start
  times, losses = [], []
  for _ in range(warmup + timed):
    start = time.perf_counter()
    params, opt_state, loss = compiled(params, opt_state, batch)
    losses.append(float(loss))  # the loss comes back to the host every step
    jax.block_until_ready((params, opt_state))
    times.append(time.perf_counter() - start)
  timed_runs = times[warmup:]
  return {"ms_per_step_runs": [t * 1e3 for t in timed_runs],
          "ms_per_step_median": statistics.median(timed_runs) * 1e3,
          "warmup_ms": [t * 1e3 for t in times[:warmup]], "compile_s": compile_s,
          "first_loss": losses[0], "last_loss": losses[-1]}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peer-resident-malloc", action="store_true",
                      help="also give the PyTorch peer our GLIBC_TUNABLES (default: its own env)")
  parser.add_argument("--model-dir", default="/tmp/bench_model")
  parser.add_argument("--peer-python", default=default_peer_python())
  parser.add_argument("--repeats", type=int, default=2,
                      help="alternating rounds of (ours, PyTorch), each 2 warm-up + 5 timed steps")
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--skip-peer", action="store_true")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                      help="compute dtype for ours (float32 is the headline figure)")
  parser.add_argument("--tiny", action="store_true",
                      help="a tiny checkpoint and batch, our side only (CI)")
  args = parser.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # Unless asked, the peer runs with the environment it was given.
  env = peer_env(args.threads, original_malloc=not args.peer_resident_malloc)
  notes = {}
  if args.tiny:
    args.model_dir = tiny_model_dir(args.model_dir, parser.get_default("model_dir"))
    args.skip_peer, args.repeats = True, 1
    notes = peer_skipped("--tiny runs our side only (PyTorch's side is the full W2)")
  else:
    ensure_bench_model(args.peer_python, args.model_dir, "workload_inputs.npz", env)

  import jax

  import rlhf_jax
  if args.tiny:
    from rlhf_jax import models
    shrink_to_tiny(models.read_hf_config(args.model_dir).num_params())

  result = {"workload": "W2_train_step", "impl": "rlhf_jax", "dtype": args.dtype,
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
            "peer_resident_malloc": args.peer_resident_malloc,
            "batch": BATCH, "seq_len": SEQ, "response_len": SEQ - PROMPT_LEN,
            "threads": args.threads, "loadavg_start": os.getloadavg()[0],
            "backend": jax.default_backend(), "devices": str(jax.devices()[0]),
            "versions": {"python": platform.python_version(), "jax": jax.__version__,
                         "rlhf_jax": rlhf_jax.__version__}, **notes}
  peaks = [] if args.skip_peer else run_json(
      [args.peer_python, str(BENCH / "matmul_peak.py"), "--threads", str(args.threads)], env)
  ours_runs, peer_runs, ratios = [], [], []
  for _ in range(args.repeats):
    ours = run_ours(args.model_dir, args.dtype)
    ours_runs.append(ours)
    if not args.skip_peer:
      peer = run_json([args.peer_python, str(BENCH / "run_hf.py"), "--model-dir", args.model_dir,
                       "--threads", str(args.threads), "--workloads", "w2"], env)[0]
      peer_runs.append(peer)
      ratios.append(peer["ms_per_step_median"] / ours["ms_per_step_median"])
  all_ours = [t for run in ours_runs for t in run["ms_per_step_runs"]]
  median_ms = statistics.median(all_ours)
  result.update(
      ours_ms_per_step_median=median_ms, ours_ms_per_step_best=min(all_ours),
      ours_ms_per_step_runs=all_ours, ours_compile_s=[r["compile_s"] for r in ours_runs],
      ours_tokens_per_s=BATCH * SEQ / (median_ms / 1e3),
      ours_response_tokens_per_s=BATCH * (SEQ - PROMPT_LEN) / (median_ms / 1e3),
      ours_model_gflops_per_s=NOMINAL_FLOPS / (median_ms / 1e3) / 1e9,
      ours_first_loss=ours_runs[0]["first_loss"], ours_last_loss=ours_runs[0]["last_loss"])
  if peer_runs:
    peer_all = [t for run in peer_runs for t in run["ms_per_step_runs"]]
    peer_ms = statistics.median(peer_all)
    peak = max(p["torch_gflops_best"] for p in peaks)
    result.update(
        pytorch_ms_per_step_median=peer_ms, pytorch_ms_per_step_runs=peer_all,
        pytorch_tokens_per_s=BATCH * SEQ / (peer_ms / 1e3),
        pytorch_first_loss=peer_runs[0]["first_loss"],
        ratio_pytorch_over_ours_per_round=ratios,
        ratio_pytorch_over_ours=statistics.median(ratios),
        matmul_peak_gflops=peak, matmul_peak=peaks,
        ours_mfu=NOMINAL_FLOPS / (median_ms / 1e3) / 1e9 / peak,
        pytorch_mfu=NOMINAL_FLOPS / (peer_ms / 1e3) / 1e9 / peak,
        versions={**result["versions"], "torch": peer_runs[0].get("torch")})
  result["loadavg_end"] = os.getloadavg()[0]
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  os.environ.setdefault("RLHF_JAX_ORIGINAL_GLIBC_TUNABLES", os.environ.get("GLIBC_TUNABLES", ""))
  from rlhf_jax.runtime import keep_host_memory_resident
  keep_host_memory_resident()  # see rlhf_jax/runtime.py: ~3 s/step of page faults otherwise
  sys.exit(main())
