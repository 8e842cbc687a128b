"""benchmarks/gpu.py's part w3: one GRPO step of shared/bench/workloads.md W3, ours
(benchmarks/grpo_step.py) and TRL's GRPOTrainer in its own process."""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys

from gpu_common import ROOT, jax_device_info, jax_peak_gib, progress


def bench_dir(args) -> pathlib.Path:
  """Where make_model.py / run_trl*.py are: --bench-dir, else .gpu/ (what the check's
  prepare step copies), else ../shared/bench."""
  for candidate in filter(None, (args.bench_dir, ROOT / ".gpu", ROOT.parent / "shared" / "bench")):
    path = pathlib.Path(candidate)
    if (path / "make_model.py").exists():
      return path
  raise FileNotFoundError("no make_model.py in --bench-dir, .gpu/ or ../shared/bench "
                          "(bash scripts/gpu_check.sh prepare copies it into .gpu/)")


def peer_environment(args) -> dict:
  env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
         "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
  if args.peer_site:
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.peer_site,
                                                      os.environ.get("PYTHONPATH", "")]))
  return env


def ensure_w3_model(args) -> None:
  if os.path.exists(os.path.join(args.model_dir, "w3_prompts.jsonl")):
    return
  progress("w3: making the checkpoint (make_model.py)")
  result = subprocess.run([args.peer_python, str(bench_dir(args) / "make_model.py"),
                           args.model_dir], capture_output=True, text=True,
                          env=peer_environment(args), timeout=900)
  if result.returncode:
    raise RuntimeError(f"make_model.py failed (rc {result.returncode}):\n{result.stderr[-3000:]}")
  progress("w3: the checkpoint made")


def w3_ours(args) -> dict:
  ensure_w3_model(args)
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import grpo_step  # noqa: E402 (benchmarks/, W3's definition of our side)
  record = {"part": "w3", "who": "ours", "tiny": args.tiny, **jax_device_info()}
  progress("w3 ours: the GRPO steps started (benchmarks/grpo_step.py)")
  steps = grpo_step.run_ours(args.model_dir)["steps"]
  timed = steps[1:]
  median = statistics.median(s["step_s"] for s in timed)
  phases = {key: statistics.median(s[key] for s in timed)
            for key in ("time_generate", "time_update") if all(key in s for s in timed)}
  record.update(s_per_step_median=median, s_per_step_timed=[s["step_s"] for s in timed],
                warmup_s=steps[0]["step_s"], phases_s=phases,
                completion_tokens_per_s=grpo_step.GROUPS * grpo_step.GROUP_SIZE
                * grpo_step.NEW_TOKENS / median,
                reward_mean=[s.get("reward_mean") for s in timed], peak_gib=jax_peak_gib())
  return record


def w3_trl(args) -> dict:
  ensure_w3_model(args)
  directory = bench_dir(args)
  script = directory / "run_trl_gpu.py"
  if not script.exists():
    script = directory / "run_trl.py"  # the CPU original: TRL then trains on the CPU
  progress(f"w3 trl: {script.name} started")
  result = subprocess.run([args.peer_python, str(script), "--model-dir", args.model_dir,
                           "--threads", str(os.cpu_count() or 2)], capture_output=True,
                          text=True, env=peer_environment(args), timeout=3600)
  if result.returncode:
    raise RuntimeError(f"{script.name} failed (rc {result.returncode}):\n{result.stderr[-3000:]}")
  rows = []
  for line in result.stdout.splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(row, dict) and row.get("workload") == "W3_grpo_step":
      rows.append(row)
  if not rows:
    raise RuntimeError(f"{script.name} printed no W3 line; stderr:\n{result.stderr[-3000:]}")
  row = rows[-1]
  probe = subprocess.run([args.peer_python, "-c", "import torch; print("
                          "torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"],
                         capture_output=True, text=True, env=peer_environment(args), timeout=300)
  on_gpu = script.name == "run_trl_gpu.py" and probe.stdout.strip() not in ("", "cpu")
  return {"part": "w3", "who": "trl", "tiny": args.tiny, "script": script.name,
          "device": probe.stdout.strip() if on_gpu else "cpu",
          "s_per_step_median": row["s_per_step_median"],
          "s_per_step_timed": row["s_per_step_timed"], "warmup_s": row["warmup_s"],
          "rollout_generate_s": row.get("rollout_generate_s"), "trl": row.get("trl"),
          "torch": row.get("torch"), "transformers": row.get("transformers")}
