"""The GPU check's benchmarks (docs/gpu.md): our train step, decode and memory against
PyTorch / transformers / TRL on the same GPU, one JSON line per measurement.

Parts (--parts, comma-separated):
  g1   PPO actor step on the Qwen2.5-0.5B shape (V=151936, E=896, L=24, H=14, K=2, D=64,
       F=4864, tied, q/k/v bias, RoPE θ 1e6), float32 parameters, bfloat16 compute,
       16 × 1024 tokens (prompt 256 + response 768). Ours is the library's own path:
       `batch.response_logprobs(..., with_entropy=True)` (LM head chunked by
       `DecoderConfig.logprob_chunk`) → `kernels.ppo_policy_loss` (token-mean) →
       `jax.value_and_grad` → optax clip 1.0 + AdamW, parameters and optimizer state
       donated. Median step time, tokens/s, MFU against the H100 SXM dense bf16 peak
       (989 TFLOP/s; FLOPs counted as shared/bench/gpu_probe.py counts them), compile and
       first-step time, XLA's memory analysis and the device's peak memory.
       Peers: `torch` (eager + autocast bf16, sdpa, fused AdamW) and `torch_compile`.
  g1b  the same at 32 × 1024 tokens: the peak memory, or the out-of-memory error.
  g2   generation, 128 slots × (prompt 128 + 512 new tokens), temperature 1, bf16 weights:
       `sampling.Engine` + `sampling.scheduler.Scheduler`; tokens/s, fraction of the HBM
       roofline (3.35 TB/s; bytes per step = weights + live KV cache at the mean context),
       first-call time (compiles, or loads from --compile-cache). Peers: `torch`
       (transformers `generate`, dynamic cache) and `torch_compile` (static cache, which
       transformers compiles).
  g3   g2 with 256 slots (32 decode steps per host sync unless --sync).
  g4   XLA's compiled memory analysis of the g1 step at 16 × 1024 and 32 × 1024 tokens with
       logprob_chunk 0 and 1024, from abstract inputs only (nothing allocated). Ours only.
  kern the fused attention kernels against the XLA path on small shapes, outputs and
       gradients, each case in its own process (benchmarks/gpu_kern.py): each case is ok,
       wrong or crashed; its `verdict` record says which kernels to trust.
  w3   shared/bench/workloads.md W3, one GRPO step (8 prompts × 8 samples, 128 new tokens):
       `who=ours` runs benchmarks/grpo_step.py's `run_ours`, `who=trl` runs TRL's
       GRPOTrainer (`run_trl_gpu.py` from --bench-dir, a copy of shared/bench/run_trl.py
       that leaves the GPU on). The checkpoint is made by make_model.py (--peer-python).

Each (part, side) runs in its own process when more than one is asked for (a torch peer
never shares a process with JAX's preallocated memory, and every peak-memory figure is one
program's). `--tiny` runs the same code paths on a 2-layer, 64-wide model with tiny shapes
(a smoke test; runs on CPU).

  python benchmarks/gpu.py --parts g1,g2,g4 --who ours [--tiny] [--logprob-chunk 1024]
      [--remat] [--scan-layers] [--decode-attention xla|pallas] [--compile-cache DIR]
      [--attention xla|cudnn|pallas|auto] [--profile DIR] [--xla-flag=--xla_...]
      [--autotune-dir benchmarks/autotune] [--autotune-dump DIR] [--autotune-level 0]
  python benchmarks/gpu.py --tiny --parts kern,g1,g2 --attention pallas --decode-attention pallas

--attention sets `DecoderConfig.attention_impl` of the train parts, --decode-attention
`decode_attention` of the generation parts. --profile DIR keeps one more timed train step, or
one short generate call (two dispatches), as DIR/profile_<part>.json.gz (Perfetto). The XLA
flags (--xla-flag, the autotune results: benchmarks/gpu_profile.py) are set before JAX starts.
A kernel that is not built yet (NotImplementedError), or cuDNN off a GPU, gives a record with
`skipped` instead of `error`.
  python benchmarks/gpu.py --parts g1 --who torch_compile
  python benchmarks/gpu.py --parts w3 --who ours,trl --bench-dir .gpu --model-dir /tmp/bm

The code: gpu_common.py (shapes, peaks, records), gpu_ours.py (our G1-G4), gpu_torch.py
(the PyTorch peers), gpu_w3.py, gpu_kern.py (kern), gpu_profile.py (XLA flags, traces),
gpu_summary.py and gpu_summary_ab.py (summary.json); this file parses and dispatches.

Progress goes to stderr, one `[gpu.py +SECONDS] ...` line as each phase starts and ends
(backend, build, compile, every timed step or call), and SIGTERM prints every thread's
stack before the process dies: the log of a step stopped at its cap says where it was.

Every record has `part`, `who`, `tiny`, `device`; a failed measurement has `error` (and
`oom: true` when the device ran out of memory) next to what it measured before failing.
For scripts/gpu_check.sh: `--mismatch LABEL=metrics.jsonl ...` prints the trainer–sampler
log-prob mismatch of arith runs, `--summarize OUT --status FILE` writes OUT/summary.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import gpu_kern  # benchmarks/, beside this file
import gpu_profile
from gpu_common import dump_stacks_on_term, emit, enable_compile_cache, error_record, progress, _STDOUT
from gpu_ours import gen_ours, memory_table, train_ours
from gpu_summary import mismatch_records, summarize
from gpu_torch import gen_torch, train_torch
from gpu_w3 import w3_ours, w3_trl

SIDES = {"g1": ("ours", "torch", "torch_compile"), "g1b": ("ours", "torch", "torch_compile"),
         "g2": ("ours", "torch", "torch_compile"), "g3": ("ours", "torch", "torch_compile"),
         "g4": ("ours",), "w3": ("ours", "trl"), "kern": ("ours",)}


def run_one(part: str, who: str, args) -> None:
  """One (part, side) in this process; every failure becomes an error record."""
  args.cache_info, args.partial = {}, {}
  progress(f"{part} {who}: starting")
  try:
    if who == "ours" and part != "w3":
      args.cache_info = {**gpu_profile.apply_xla_flags(args),
                         **enable_compile_cache(args.compile_cache)}
    if part == "g4":
      memory_table(args)
      return
    if part == "kern":  # no backend here: each case starts its own (gpu_kern.py)
      base = {"who": "ours", "tiny": args.tiny, **args.cache_info}
      gpu_kern.run_kern(args.tiny, [i for i in args.kern_impls.split(",") if i], emit, base,
                        compile_cache=args.compile_cache, case_timeout=args.kern_case_timeout)
      progress("kern: done")
      return
    if part in ("g1", "g1b"):
      record = train_ours(part, args) if who == "ours" else train_torch(part, who, args)
    elif part in ("g2", "g3"):
      record = gen_ours(part, args) if who == "ours" else gen_torch(part, who, args)
    elif part == "w3":
      record = w3_ours(args) if who == "ours" else w3_trl(args)
    else:
      raise ValueError(f"unknown part {part!r}")
    emit(record)
    progress(f"{part} {who}: done")
  except NotImplementedError as error:  # a kernel not built yet, or GPU-only: said, not failed
    progress(f"{part} {who}: skipped: {error}")
    emit({**args.partial, "part": part, "who": who, "tiny": args.tiny,
          "skipped": f"{type(error).__name__}: {error}"[:2000]})
  except Exception as error:  # noqa: BLE001 (the figures measured so far stay)
    progress(f"{part} {who}: failed: {type(error).__name__}: {str(error)[:200]}")
    emit({**args.partial, **error_record(part, who, args, error)})


def child_command(part: str, who: str) -> list[str]:
  """This program's own arguments with --parts / --who narrowed to one pair."""
  argv, skip = [], False
  for arg in sys.argv[1:]:
    if skip:
      skip = False
      continue
    if arg in ("--parts", "--who"):
      skip = True
      continue
    if arg.startswith(("--parts=", "--who=")):
      continue
    argv.append(arg)
  return [sys.executable, os.path.abspath(__file__), *argv, "--parts", part, "--who", who]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--parts", default="g1,g1b,g2,g3,g4")
  parser.add_argument("--who", default="ours",
                      help="ours, torch, torch_compile (g1/g1b/g2/g3), trl (w3); "
                           "comma-separated: one process each")
  parser.add_argument("--tiny", action="store_true", help="2-layer 64-wide model, tiny shapes")
  parser.add_argument("--steps", type=int, default=None, help="timed train steps (5; tiny 2)")
  parser.add_argument("--reps", type=int, default=None,
                      help="timed generate calls after the first (2; tiny 1); 0: first only")
  parser.add_argument("--sync", type=int, default=None,
                      help="decode steps per host sync (g2 16, g3 32)")
  parser.add_argument("--logprob-chunk", type=int, default=None,
                      help="DecoderConfig.logprob_chunk (1024; tiny 16; 0 = unchunked)")
  parser.add_argument("--remat", action="store_true", help="DecoderConfig.remat")
  parser.add_argument("--scan-layers", action="store_true", help="DecoderConfig.scan_layers")
  parser.add_argument("--decode-attention", default="xla", choices=("auto", "xla", "pallas"))
  parser.add_argument("--attention", default="xla", choices=("auto", "xla", "cudnn", "pallas"),
                      help="DecoderConfig.attention_impl of the train parts")
  parser.add_argument("--kern-impls", default="cudnn,pallas",
                      help="kern: the fused training kernels to check against xla")
  parser.add_argument("--kern-case-timeout", type=float, default=120.0,
                      help="kern: seconds for each case's own process")
  parser.add_argument("--profile", metavar="DIR", default=None,
                      help="one more step (or a short generate) traced: DIR/profile_<part>.json.gz")
  parser.add_argument("--xla-flag", action="append", default=None,
                      help="an XLA flag for our parts (repeatable; the user's XLA_FLAGS win)")
  parser.add_argument("--autotune-dir", default=None,
                      help="load the carried autotune results for this GPU and XLA from here")
  parser.add_argument("--autotune-dump", default=None,
                      help="write this run's autotune results here (named by GPU and XLA)")
  parser.add_argument("--autotune-level", type=int, default=None,
                      help="--xla_gpu_autotune_level (0: off)")
  parser.add_argument("--compile-cache", default=None,
                      help="JAX persistent compilation cache directory (our g1-g4); every "
                           "record says how many entries it held at the start")
  parser.add_argument("--model-dir", default="/tmp/bench_model", help="W3 checkpoint")
  parser.add_argument("--bench-dir", default=None,
                      help="make_model.py / run_trl_gpu.py (default .gpu, ../shared/bench)")
  parser.add_argument("--peer-python", default=sys.executable,
                      help="python with torch (+ TRL for w3 trl)")
  parser.add_argument("--peer-site", default=None,
                      help="extra PYTHONPATH for the TRL peer (its carried wheels)")
  parser.add_argument("--child-timeout", type=float, default=None,
                      help="seconds per (part, side) process when several are run")
  parser.add_argument("--summarize", metavar="OUT", help=argparse.SUPPRESS)  # gpu_check.sh
  parser.add_argument("--status", help=argparse.SUPPRESS)
  parser.add_argument("--budget", type=float, help=argparse.SUPPRESS)
  parser.add_argument("--mismatch", nargs="+", metavar="LABEL=METRICS_JSONL",
                      help="summarise the log-prob mismatch metrics of arith runs and exit")
  args = parser.parse_args()
  if args.summarize:
    summarize(args.summarize, args.status, args.budget)
    return 0
  if args.mismatch:
    mismatch_records(args.mismatch)
    return 0
  if args.steps is None:
    args.steps = 2 if args.tiny else 5
  if args.reps is None:
    args.reps = 1 if args.tiny else 2
  parts = [p for p in args.parts.split(",") if p]
  sides = [w for w in args.who.split(",") if w]
  unknown = [p for p in parts if p not in SIDES]
  if unknown:
    parser.error(f"unknown parts {unknown}; known: {', '.join(SIDES)}")
  pairs = [(p, w) for p in parts for w in sides if w in SIDES[p]]
  if not pairs:
    parser.error(f"no part of {parts} has a side in {sides}")
  dump_stacks_on_term()  # a step killed at its cap prints where it was
  if len(pairs) == 1:
    sys.stdout = sys.stderr  # library prints stay off the JSON stream
    run_one(*pairs[0], args)
    return 0
  for part, who in pairs:  # one process each
    try:
      result = subprocess.run(child_command(part, who), stdout=_STDOUT, timeout=args.child_timeout)
      if result.returncode:
        emit({"part": part, "who": who, "tiny": args.tiny,
              "error": f"process exited with status {result.returncode}"})
    except subprocess.TimeoutExpired:
      emit({"part": part, "who": who, "tiny": args.tiny,
            "error": f"timed out after {args.child_timeout} s"})
  return 0


if __name__ == "__main__":
  sys.exit(main())
