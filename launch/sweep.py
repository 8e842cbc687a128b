r"""An ablation sweep: every arm × seed as a launch/train.py run, then a table and a plot.

  python launch/sweep.py --config=configs/dapo.py:arith --root=runs/repro/dapo \
      --arm="clip-higher:" --arm="symmetric: algorithm.policy_loss.clip_high=0.2" \
      --set="train.steps=20 train.eval_every=5" --stat=late_mean:entropy \
      --stat=gain:eval_accuracy --plot_metrics=entropy,eval_accuracy \
      --plot=docs/reproductions/dapo_clip_higher.png

Each run lives in <root>/<arm>/seed<k> and starts from the SFT warm start of seed k
(--warm_start; trained first with --warm_start_config when missing, by default
configs/dapo.py:arith, the demo's own).
A finished run (its done.json) is reused, so rows that share an arm share its runs, and
an interrupted sweep resumes where it stopped (an unfinished run resumes from its
checkpoint). Every arm's config is checked first (train.py --validate_only): a bad
override stops the sweep, in one line with exit status 2, before anything trains. Each
run's console goes to <run>/train.log. Prints the markdown table (also written to
--table) and the summary as JSON.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

from absl import flags

_CONFIG = flags.DEFINE_string("config", None, "Preset (configs/*.py:arith).")
_ROOT = flags.DEFINE_string("root", None, "Sweep directory: <root>/<arm>/seed<k>.")
_ARMS = flags.DEFINE_multi_string("arm", [], "'name: key=value ...' (config overrides).")
_SET = flags.DEFINE_multi_string("set", [], "'key=value ...' overrides for every arm.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (config.seed and warm start).")
_STATS = flags.DEFINE_multi_string("stat", [], "kind:metric[:threshold] (rlhf_jax.analysis."
                                   "sweeps.STATS) for the table.")
_PLOT_METRICS = flags.DEFINE_list("plot_metrics", ["eval_accuracy"], "Metrics to plot.")
_X = flags.DEFINE_enum("x", "step", ["step", "seconds"], "Plot against steps or training "
                       "seconds.")
_PLOT = flags.DEFINE_string("plot", "", "PNG path of the curves (needs the plot extra).")
_TABLE = flags.DEFINE_string("table", "", "Markdown path of the table.")
_TITLE = flags.DEFINE_string("title", "", "Plot title.")
_WARM_START = flags.DEFINE_string("warm_start", "runs/repro/arith_sft_seed{seed}",
                                  "SFT warm start directory per seed ({seed} is replaced).")
_WARM_START_CONFIG = flags.DEFINE_string(
    "warm_start_config", "configs/dapo.py:arith", "The preset the warm start is trained "
    "with (launch/sft.py); configs/toolcalc.py for the toolcalc task.")
_WARM_START_SET = flags.DEFINE_multi_string(
    "warm_start_set", [], "'key=value ...' overrides of the warm start's training "
    "(--warm_start_config); the arms' overrides do not reach it, so rows share it.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the commands, run nothing.")
flags.mark_flags_as_required(["config", "root"])


def _overrides(arm) -> list[str]:
  return [f"--config.{key}={value}" for key, value in arm.overrides]


def _fail(message: str) -> None:
  """Bad input: one line on stderr, exit status 2 (as train.py's config errors)."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  raise SystemExit(2)


def _run(command: list[str], log_path: str) -> None:
  with open(log_path, "a", encoding="utf-8") as log:
    log.write(" ".join(command) + "\n")
    log.flush()
    code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
  if code:
    with open(log_path, encoding="utf-8") as log:
      tail = log.read()[-3000:]
    raise SystemExit(f"{' '.join(command)}\nexited with {code}; the end of {log_path}:\n{tail}")


def _ensure_warm_start(seed: int, directory: str, overrides: list[str]) -> None:
  if os.path.exists(os.path.join(directory, "config.json")):
    return
  os.makedirs(directory, exist_ok=True)
  print(f"[sweep] seed {seed}: training the SFT warm start {directory}", flush=True)
  _run([sys.executable, "launch/sft.py", f"--config={_WARM_START_CONFIG.value}",
        f"--config.seed={seed}", f"--config.model.checkpoint={directory}",
        f"--workdir={os.path.dirname(directory) or '.'}", *overrides], directory + ".log")


def _train_command(arm, seed: int, common: list[str]) -> list[str]:
  return [sys.executable, "launch/train.py", f"--config={_CONFIG.value}",
          f"--workdir={os.path.join(_ROOT.value, arm.name, f'seed{seed}')}",
          f"--config.seed={seed}",
          f"--config.model.checkpoint={_WARM_START.value.format(seed=seed)}",
          "--config.train.loggers=", *common, *_overrides(arm)]


def _check_arms(arms, seed: int, common: list[str]) -> None:
  """Every arm's config through train.py --validate_only, before anything trains: a
  misspelt key in the last arm fails now, not after the first arms' runs."""
  for arm in arms:
    result = subprocess.run(_train_command(arm, seed, common) + ["--validate_only"],
                            capture_output=True, text=True, check=False)
    if result.returncode:
      last = (result.stderr.strip().splitlines() or ["(no message)"])[-1]
      _fail(f"arm {arm.name!r}: {last.removeprefix('error: ')}")


def _run_arm(arm, seed: int, common: list[str]) -> str:
  workdir = os.path.join(_ROOT.value, arm.name, f"seed{seed}")
  command = _train_command(arm, seed, common)
  if _DRY_RUN.value:
    print(" ".join(command))
    return workdir
  done = os.path.join(workdir, "done.json")
  if os.path.exists(done):
    with open(done, encoding="utf-8") as f:
      if json.load(f)["command"][2:] != command[2:]:
        raise SystemExit(f"{workdir} holds a finished run of other settings; delete it or "
                         "rename the arm.")
    return workdir
  os.makedirs(workdir, exist_ok=True)
  print(f"[sweep] {arm.name} seed {seed}: {workdir}", flush=True)
  start = time.perf_counter()
  _run(command, os.path.join(workdir, "train.log"))
  with open(done, "w", encoding="utf-8") as f:
    json.dump({"command": command, "seconds": time.perf_counter() - start}, f)
  return workdir


def main(argv) -> None:
  del argv
  from rlhf_jax.analysis import sweeps
  from rlhf_jax.analysis.report import read_metrics
  try:
    arms = [sweeps.parse_arm(text) for text in _ARMS.value]
    stats = [sweeps.parse_stat(text) for text in _STATS.value]
    common = _overrides(sweeps.parse_arm("common: " + " ".join(_SET.value)))
    warm_start = _overrides(sweeps.parse_arm("sft: " + " ".join(_WARM_START_SET.value)))
  except ValueError as error:
    _fail(str(error))
  if not all(seed.strip().isdigit() for seed in _SEEDS.value):
    _fail(f"--seeds={','.join(_SEEDS.value)}: expected integers >= 0")
  seeds = [int(seed) for seed in _SEEDS.value]
  if not arms:
    _fail("give at least one --arm")
  if len({a.name for a in arms}) != len(arms):
    _fail("arm names repeat")
  _check_arms(arms, seeds[0], common)
  results = {}
  for seed in seeds:  # seed-major: a stopped sweep has every arm of its first seeds
    if not _DRY_RUN.value:
      _ensure_warm_start(seed, _WARM_START.value.format(seed=seed), warm_start)
    for arm in arms:
      workdir = _run_arm(arm, seed, common)
      if not _DRY_RUN.value:
        results.setdefault(arm.name, {})[seed] = read_metrics(
            os.path.join(workdir, "metrics.jsonl"))
  if _DRY_RUN.value:
    return
  results = {arm.name: results[arm.name] for arm in arms}
  table = sweeps.markdown_table(results, stats) if stats else ""
  if _TABLE.value:
    with open(_TABLE.value, "w", encoding="utf-8") as f:
      f.write(table)
  print(table, end="")
  if _PLOT.value and not sweeps.plot_sweep(results, _PLOT_METRICS.value, _PLOT.value,
                                           x=_X.value, title=_TITLE.value):
    print("no plot: matplotlib is missing (pip install 'rlhf-jax[plot]')", flush=True)
  finite = lambda v: None if math.isnan(v) else v  # strict JSON has no NaN
  summary = {arm: {str(seed): {s.label: finite(sweeps.statistic(records, s)) for s in stats}
                   for seed, records in runs.items()} for arm, runs in results.items()}
  print(json.dumps({"event": "sweep", "root": _ROOT.value, "summary": summary}), flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main, compile_cache=False)  # a flag error in one line, exit 2; JAX not imported
