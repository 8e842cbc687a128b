"""W3 (shared/bench/workloads.md): one full GRPO step of our trainer vs TRL's GRPOTrainer.

Ours: `rlhf_jax.training.Trainer` on configs/grpo.py:hf with the workload's settings (8 prompts
× 8 samples, exactly 128 new tokens at temperature 1 with EOS ignored, reward 1 if the answer
string is in the decoded completion, group-normalised advantages, PPO-clip 0.2 on-policy,
token-mean loss, no KL, clip 1.0, AdamW lr 1e-6), prompts in file order (step k uses prompts
8k..8k+7). A step runs from fetching the prompts to updated parameters on the host side
(`Trainer.train_step`, which blocks on the new parameters). 4 steps, the first untimed. The
peer is `shared/bench/run_trl.py` in the same session; the matmul peak of
`shared/bench/matmul_peak.py` too. Prints one JSON line with the phase breakdown and each
phase's model FLOP rate as a fraction of the peak.

  python benchmarks/grpo_step.py [--model-dir /tmp/bench_model] [--repeats 1]
      [--peer-python /tmp/venv_peers/bin/python] [--skip-peer] [--set FIELD=VALUE ...]
  python benchmarks/grpo_step.py --tiny   (CI: our side only, seconds on CPU)

`--tiny` runs the same code on a 1-layer, 32-wide checkpoint of our own making
(common.tiny_bench_model), 2 prompts x 2 samples, 8 new tokens, 2 steps; the peer is
skipped (its workload is the full one) and the record says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile


from common import BENCH
from common import default_peer_python
from common import ensure_bench_model
from common import peer_env
from common import peer_skipped
from common import run_json
from common import tiny_model_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]
N_PARAMS = 24_656_384
GROUPS, GROUP_SIZE, PROMPT_LEN, NEW_TOKENS = 8, 8, 64, 128
ROLLOUT_FLOPS = 2 * N_PARAMS * GROUPS * GROUP_SIZE * (PROMPT_LEN + NEW_TOKENS)
UPDATE_FLOPS = 6 * N_PARAMS * GROUPS * GROUP_SIZE * (PROMPT_LEN + NEW_TOKENS)
STEPS = 4  # the first untimed


def shrink_to_tiny(n_params: int) -> None:
  """--tiny: W3's shapes shrunk so a step takes well under a second on CPU; the FLOP
  counts of the tiny checkpoint's `n_params`."""
  global GROUPS, GROUP_SIZE, PROMPT_LEN, NEW_TOKENS, N_PARAMS, STEPS
  global ROLLOUT_FLOPS, UPDATE_FLOPS
  GROUPS, GROUP_SIZE, PROMPT_LEN, NEW_TOKENS, N_PARAMS, STEPS = 2, 2, 16, 8, n_params, 2
  ROLLOUT_FLOPS = 2 * N_PARAMS * GROUPS * GROUP_SIZE * (PROMPT_LEN + NEW_TOKENS)
  UPDATE_FLOPS = 6 * N_PARAMS * GROUPS * GROUP_SIZE * (PROMPT_LEN + NEW_TOKENS)


def w3_config(model_dir: str, train_file: str):
  """configs/grpo.py:hf set to W3's workload (workloads.md, W3)."""
  spec = importlib.util.spec_from_file_location("grpo", ROOT / "configs" / "grpo.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("hf")
  c.model.checkpoint = model_dir
  c.data.train_file, c.data.prompt_length, c.data.shuffle = train_file, PROMPT_LEN, False
  c.rollout.prompts_per_step, c.rollout.max_new_tokens = GROUPS, NEW_TOKENS
  c.rollout.stop_at_eos = False  # EOS is an ordinary token in W3
  c.rollout.group_size = GROUP_SIZE
  c.algorithm.policy_loss.clip_low = c.algorithm.policy_loss.clip_high = 0.2
  c.algorithm.policy_loss.agg = "token-mean"  # TRL loss_type="dapo"
  c.algorithm.kl.placement, c.algorithm.kl.coef = "none", 0.0
  c.reward.correct_score, c.reward.wrong_score = 1.0, 0.0
  c.optimizer.learning_rate, c.optimizer.warmup_steps = 1e-6, 1
  c.optimizer.weight_decay, c.optimizer.max_grad_norm = 0.0, 1.0
  c.train.steps, c.train.epochs, c.train.minibatches = 4, 1, 1
  c.sampler.num_slots, c.sampler.cache_length = GROUPS * GROUP_SIZE, PROMPT_LEN + NEW_TOKENS
  c.sampler.prompt_buckets, c.sampler.steps_per_sync = (PROMPT_LEN,), 32
  return c


def contains_answer(response: str, answer: str) -> bool:
  """workload_data.w3_reward: the answer string appears in the decoded completion."""
  return answer in response


def apply_overrides(config, overrides: list[str]):
  """`--set model.logprob_chunk=0`-style overrides (a Python literal after the =)."""
  import ast
  for item in overrides:
    path, _, text = item.partition("=")
    *sections, field = path.split(".")
    target = config
    for name in sections:
      target = target[name]
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    target[field] = value
  return config


def run_ours(model_dir: str, overrides: list[str] = ()) -> dict:
  """`STEPS` (four) `Trainer.train_step` calls on W3's prompts; each step's metrics and
  wall time."""
  import time

  from rlhf_jax.rewards import RewardRouter
  from rlhf_jax.training.loop import Trainer

  prompts = [json.loads(line) for line in open(os.path.join(model_dir, "w3_prompts.jsonl"))]
  with tempfile.TemporaryDirectory() as workdir:
    train_file = os.path.join(workdir, "w3.jsonl")
    with open(train_file, "w") as f:
      for p in prompts:
        f.write(json.dumps({"prompt": p["prompt"], "answer": p["answer"], "task": "w3"}) + "\n")
    config = apply_overrides(w3_config(model_dir, train_file), overrides)
    scorer = RewardRouter({"w3": contains_answer}, correct_score=1.0, wrong_score=0.0)
    trainer = Trainer(config, os.path.join(workdir, "run"), log=lambda line: None,
                      scorer=scorer)
    encode = trainer.rollout.inner.generator.encode
    for p in prompts:  # our tokenizer gives the workload's ids
      assert encode(trainer.train_examples[prompts.index(p)]) == p["prompt_ids"]
    steps = []
    for _ in range(STEPS):
      start = time.perf_counter()
      metrics = trainer.train_step()
      metrics["step_s"] = time.perf_counter() - start
      steps.append(metrics)
  return {"steps": steps}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model-dir", default="/tmp/bench_model")
  parser.add_argument("--peer-python", default=default_peer_python())
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--skip-peer", action="store_true")
  parser.add_argument("--tiny", action="store_true",
                      help="a tiny checkpoint and workload, our side only (CI)")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="override a config field of ours, e.g. model.logprob_chunk=0")
  args = parser.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  env = peer_env(args.threads)
  notes = {}
  if args.tiny:
    args.model_dir = tiny_model_dir(args.model_dir, parser.get_default("model_dir"))
    args.skip_peer = True
    args.set = ["sampler.warmup=False", *args.set]  # compile on first use: fewer programs
    notes = peer_skipped("--tiny runs our side only (TRL's side is the full W3 workload)")
  else:
    ensure_bench_model(args.peer_python, args.model_dir, "w3_prompts.jsonl", env)
  import jax

  import rlhf_jax
  if args.tiny:
    from rlhf_jax import models
    shrink_to_tiny(models.read_hf_config(args.model_dir).num_params())

  peaks = [] if args.skip_peer else run_json(
      [args.peer_python, str(BENCH / "matmul_peak.py"), "--threads", str(args.threads)], env)
  ours_runs, peer_runs, ratios = [], [], []
  for _ in range(args.repeats):
    ours = run_ours(args.model_dir, args.set)
    ours_runs.append(ours)
    if not args.skip_peer:
      peer = [r for r in run_json([args.peer_python, str(BENCH / "run_trl.py"), "--model-dir",
                                   args.model_dir, "--threads", str(args.threads)], env)
              if r.get("workload") == "W3_grpo_step"][0]
      peer_runs.append(peer)
      ratios.append(peer["s_per_step_median"]
                    / statistics.median(s["step_s"] for s in ours["steps"][1:]))
  timed = [s for run in ours_runs for s in run["steps"][1:]]
  median = lambda key: statistics.median(s[key] for s in timed)
  step_s = median("step_s")
  phases = {key: median(key) for key in ("time_generate", "time_update")}
  result = {"workload": "W3_grpo_step", "impl": "rlhf_jax", "threads": args.threads,
            "loadavg_start": os.getloadavg()[0], "backend": jax.default_backend(),
            "versions": {"python": platform.python_version(), "jax": jax.__version__,
                         "rlhf_jax": rlhf_jax.__version__},
            "ours_s_per_step_median": step_s, "ours_s_per_step_runs": [s["step_s"] for s in timed],
            "ours_warmup_s": [run["steps"][0]["step_s"] for run in ours_runs],
            "ours_phases_s": phases,
            "ours_completion_tokens_per_s": GROUPS * GROUP_SIZE * NEW_TOKENS / step_s,
            "ours_model_gflops_per_s": (ROLLOUT_FLOPS + UPDATE_FLOPS) / step_s / 1e9,
            "rewards_mean": [s["reward_mean"] for s in timed], **notes}
  if peer_runs:
    peak = max(p["torch_gflops_best"] for p in peaks)
    peer_s = statistics.median(t for run in peer_runs for t in run["s_per_step_timed"])
    result.update(
        trl_s_per_step_median=peer_s,
        trl_s_per_step_runs=[t for run in peer_runs for t in run["s_per_step_timed"]],
        ratio_trl_over_ours_per_round=ratios, ratio_trl_over_ours=statistics.median(ratios),
        matmul_peak_gflops=peak,
        ours_mfu=(ROLLOUT_FLOPS + UPDATE_FLOPS) / step_s / 1e9 / peak,
        ours_generation_fraction_of_peak=ROLLOUT_FLOPS / phases["time_generate"] / 1e9 / peak,
        ours_update_fraction_of_peak=UPDATE_FLOPS / phases["time_update"] / 1e9 / peak,
        trl_mfu=(ROLLOUT_FLOPS + UPDATE_FLOPS) / peer_s / 1e9 / peak,
        versions={**result["versions"], "trl": peer_runs[0].get("trl"),
                  "torch": peer_runs[0].get("torch")})
  result["loadavg_end"] = os.getloadavg()[0]
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  os.environ.setdefault("RLHF_JAX_ORIGINAL_GLIBC_TUNABLES", os.environ.get("GLIBC_TUNABLES", ""))
  sys.path.insert(0, str(ROOT))
  from rlhf_jax.runtime import keep_host_memory_resident
  keep_host_memory_resident()
  sys.exit(main())
