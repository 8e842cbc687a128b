"""Synchronous against bounded-staleness GRPO on arith, sampler and trainer on their own cores.

For each seed and each `rollout.max_staleness` k, a sampling server (launch/serve.py,
pinned with `taskset` to one core) and the trainer (launch/train.py with
`sampler.address`, pinned to the other) run `--steps` GRPO steps from one shared arith
warm start. Reported per run and per k: wall time per step, samples/s, held-out accuracy
against steps and wall time; the ratio of samples/s against k = 0 of the same seed.

  python benchmarks/async_rl.py [--steps 30] [--seeds 0,1,2] [--staleness 0,1,2]
      [--workdir /tmp/async_rl] [--sampler-cpus 0] [--trainer-cpus 1] [--plot FILE]
      [--set KEY=VALUE ...] (trainer config overrides, every run)
      [--partial]     (k > 0 with rollout.partial_rollouts; the server swaps mid-sample)
      [--reference sampler|trainer]  (who computes the KL term's reference log-probs,
                      rollout.reference_logprobs; default: the server, off the trainer's core)
      [--summarise]   (recompute the figures of the runs already in --workdir)

Prints one JSON line per run, then one per k (`"summary": true`).

  python benchmarks/async_rl.py --tiny   (CI: one seed, k = 0, 4 steps of a 1-layer
                                          32-wide model: the same processes, seconds each)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = "configs/grpo.py:arith"
# --tiny: a 1-layer, 32-wide warm start of 2 SFT steps, 2 prompts x 2 samples per step.
TINY_WARM_START = ["--config.model.hidden_size=32", "--config.model.num_layers=1",
                   "--config.model.num_heads=2", "--config.sft.steps=2",
                   "--config.sft.batch_size=8", "--config.data.num_eval=4"]
TINY_TRAINER = ["data.num_train=32", "data.num_eval=4", "sampler.num_slots=8",
                "sampler.warmup=False", "train.minibatches=1"]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def pinned(cpus: str) -> list[str]:
  """`taskset -c cpus` when available (else nothing: the run is then unpinned)."""
  return ["taskset", "-c", cpus] if cpus and shutil.which("taskset") else []


def warm_start(workdir: str, flags: list[str] = ()) -> str:
  """The arith SFT warm start every run starts from (trained once; `flags` shrink it)."""
  sft = os.path.join(workdir, "warm", "sft")
  if not os.path.exists(os.path.join(sft, "config.json")):
    subprocess.run([sys.executable, "launch/sft.py", f"--config={PRESET}",
                    f"--workdir={os.path.join(workdir, 'warm')}", *flags], cwd=ROOT,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  return sft


def start_server(checkpoint: str, port: int, cpus: str, log_path: str,
                 update_policy: str = "finish_old") -> subprocess.Popen:
  """launch/serve.py with the arith trainer's sampler settings; waits until it listens."""
  log = open(log_path, "w")
  server = subprocess.Popen(
      pinned(cpus) + [sys.executable, "launch/serve.py", "--config=configs/serve.py:hf",
                      f"--config.model.checkpoint={checkpoint}", f"--config.server.port={port}",
                      "--config.server.max_workers=32", "--config.sampler.num_slots=64",
                      "--config.sampler.cache_length=128", "--config.sampler.prompt_buckets=64",
                      f"--config.sampler.update_policy={update_policy}"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
  for line in server.stdout:
    if '"serving"' in line:
      return server
  raise RuntimeError(f"the server did not start; see {log_path}")


def run_one(args, checkpoint: str, seed: int, k: int) -> dict:
  """One pinned server + trainer run; its figures from metrics.jsonl."""
  workdir = os.path.join(args.workdir, f"k{k}_seed{seed}")
  shutil.rmtree(workdir, ignore_errors=True)
  os.makedirs(workdir)
  port = free_port()
  server = start_server(checkpoint, port, args.sampler_cpus, os.path.join(workdir, "server.log"),
                        "swap_now" if args.partial else "finish_old")
  try:
    start = time.perf_counter()
    subprocess.run(
        pinned(args.trainer_cpus) + [
            sys.executable, "launch/train.py", f"--config={PRESET}", f"--workdir={workdir}",
            f"--config.model.checkpoint={checkpoint}", f"--config.seed={seed}",
            f"--config.rollout.max_staleness={k}", f"--config.sampler.address=localhost:{port}",
            f"--config.train.steps={args.steps}", f"--config.train.eval_every={args.eval_every}",
            "--config.train.loggers=", f"--config.train.checkpoint_every={args.steps}",
            "--config.train.eval_samples=0",
            f"--config.rollout.reference_logprobs={args.reference}"]
        + [f"--config.{item}" for item in args.set]
        + ([f"--config.rollout.partial_rollouts={bool(k and args.partial)}"]),
        cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=open(
            os.path.join(workdir, "train.log"), "w"))
    wall = time.perf_counter() - start
  finally:
    server.kill()
    server.wait()
  return figures(args, workdir, seed, k, wall)


def figures(args, workdir: str, seed: int, k: int, wall: float | None) -> dict:
  """A run's figures from its metrics.jsonl."""
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  steps = [r for r in records if "reward_mean" in r]
  # Wall time of a step: elapsed_s since the previous step, over the steps after the first
  # (compiles) that did not evaluate (a step's elapsed_s is taken after its evaluation,
  # and evaluation is not the loop's cost).
  step_s = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(steps[1:], steps[2:])
            if "eval_accuracy" not in b]
  samples_per_step = args.prompts_per_step * args.group_size
  evals = [(r["step"], r.get("elapsed_s", 0.0), r["eval_accuracy"]) for r in records
           if "eval_accuracy" in r]
  return {"k": k, "seed": seed, "steps": len(steps), "wall_s": wall,
          "s_per_step": statistics.mean(step_s),
          "samples_per_s": samples_per_step / statistics.mean(step_s),
          "time_generate_mean": statistics.mean(r["time_generate"] for r in steps[1:]),
          "time_update_mean": statistics.mean(r["time_update"] for r in steps[1:]),
          "stale_token_fraction_mean": statistics.mean(
              r.get("staleness/stale_token_fraction", 0.0) for r in steps[1:]),
          "mixed_version_row_fraction_mean": statistics.mean(
              r.get("staleness/mixed_version_row_fraction", 0.0) for r in steps[1:]),
          "eval_accuracy": evals, "final_eval_accuracy": evals[-1][2]}


def summarise(runs: list[dict]) -> list[dict]:
  """Per k: mean figures and the samples/s ratio to k = 0 of the same seed."""
  out = []
  base = {r["seed"]: r["samples_per_s"] for r in runs if r["k"] == 0}
  for k in sorted({r["k"] for r in runs}):
    mine = [r for r in runs if r["k"] == k]
    ratios = [r["samples_per_s"] / base[r["seed"]] for r in mine if r["seed"] in base]
    accuracy = [r["final_eval_accuracy"] for r in mine]
    out.append({"summary": True, "k": k, "runs": len(mine),
                "s_per_step_mean": statistics.mean(r["s_per_step"] for r in mine),
                "samples_per_s_mean": statistics.mean(r["samples_per_s"] for r in mine),
                "samples_per_s_ratio_to_sync": ratios,
                "final_eval_accuracy": accuracy,
                "final_eval_accuracy_mean": statistics.mean(accuracy),
                "final_eval_accuracy_range": [min(accuracy), max(accuracy)]})
  return out


def plot(runs: list[dict], path: str) -> None:
  """Held-out accuracy against wall time, one line per run, one colour per k."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  colours = {0: "tab:blue", 1: "tab:orange", 2: "tab:green", 3: "tab:red"}
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for r in runs:
    steps, seconds, accuracy = zip(*r["eval_accuracy"])
    label = f"k={r['k']}" if r["seed"] == min(x["seed"] for x in runs) else None
    axes[0].plot(seconds, accuracy, color=colours.get(r["k"], "k"), alpha=0.7, label=label)
    axes[1].plot(steps, accuracy, color=colours.get(r["k"], "k"), alpha=0.7, label=label)
  axes[0].set(xlabel="wall time (s)", ylabel="held-out accuracy (greedy)")
  axes[1].set(xlabel="step", ylabel="held-out accuracy (greedy)")
  axes[0].legend()
  fig.suptitle("GRPO on arith: sampler and trainer on one core each")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--eval-every", type=int, default=10)
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--staleness", default="0,1,2")
  parser.add_argument("--workdir", default="/tmp/async_rl")
  parser.add_argument("--sampler-cpus", default="0")
  parser.add_argument("--trainer-cpus", default="1")
  parser.add_argument("--prompts-per-step", type=int, default=16)  # the arith preset's
  parser.add_argument("--group-size", type=int, default=8)
  parser.add_argument("--partial", action="store_true",
                      help="partial rollouts for k > 0 (the server swaps weights under the "
                      "samples in flight: sampler.update_policy=swap_now)")
  parser.add_argument("--reference", choices=("sampler", "trainer"), default="sampler",
                      help="rollout.reference_logprobs of every run: the server computes "
                      "the reference log-probs (sampler) or the trainer does")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="one more trainer config override for every run, e.g. "
                      "train.packing=True (repeatable)")
  parser.add_argument("--plot", default="")
  parser.add_argument("--summarise", action="store_true",
                      help="recompute the figures from the runs already in --workdir")
  parser.add_argument("--tiny", action="store_true",
                      help="one seed, k = 0, 4 steps of a tiny model (CI)")
  args = parser.parse_args()
  if args.tiny:  # a step's time is a difference of two steps after the first (it compiles)
    # that did not evaluate: 4 steps, evaluated at the start and the end
    args.steps, args.eval_every, args.seeds, args.staleness = 4, 4, "0", "0"
    args.prompts_per_step, args.group_size = 2, 2
    args.set = [*TINY_TRAINER, "rollout.prompts_per_step=2", "rollout.group_size=2", *args.set]
  os.makedirs(args.workdir, exist_ok=True)
  runs = []
  checkpoint = None if args.summarise else warm_start(
      args.workdir, TINY_WARM_START if args.tiny else [])
  for seed in [int(s) for s in args.seeds.split(",")]:
    for k in [int(k) for k in args.staleness.split(",")]:  # alternating k within a seed
      if args.summarise:
        runs.append(figures(args, os.path.join(args.workdir, f"k{k}_seed{seed}"), seed, k,
                            None))
      else:
        runs.append(run_one(args, checkpoint, seed, k))
      print(json.dumps(runs[-1]), flush=True)
  for line in summarise(runs):
    print(json.dumps(line), flush=True)
  if args.plot:
    plot(runs, args.plot)
  return 0


if __name__ == "__main__":
  sys.exit(main())
