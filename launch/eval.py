r"""Accuracy and pass@k of checkpoints on a JSONL of prompts with answers (printed as JSON).

  python launch/eval.py --checkpoint=/tmp/dapo/policy --data=held_out.jsonl --samples=8
  python launch/eval.py --checkpoint=/tmp/dapo/policy --arith_levels=1,2,3   # generated
  python launch/eval.py --checkpoint=A,B,C --samples=16 --temperature=1 \
      --fire=none,first_token,every_line --table=passk.md --plot=passk.png

The JSONL schema is the training one (prompt, answer, task, metadata). Without
--data the built-in arith generator writes held-out problems (seed --arith_seed).
--fire compares sampling modes in one run (FIRE, Chen et al. arXiv:2410.21236: a
flaming-hot first token, or a hot first token of every line, then regular sampling at
--temperature); one JSON line per checkpoint and mode, and with several checkpoints or
modes a pass@k table (their mean, each checkpoint in brackets) and plot.
"""

from __future__ import annotations

import json

from absl import app
from absl import flags

FIRE_MODES = ("none", "first_token", "every_line")
_CHECKPOINT = flags.DEFINE_list("checkpoint", None, "HF checkpoint directories of policies.")
_DATA = flags.DEFINE_string("data", "", "JSONL of prompts with answers (default: arith).")
_SAMPLES = flags.DEFINE_integer("samples", 1, "Samples per prompt (n of pass@k).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0: greedy).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_FIRE = flags.DEFINE_list("fire", ["none"], f"Sampling modes, of {', '.join(FIRE_MODES)}.")
_FIRE_TEMPERATURE = flags.DEFINE_float("fire_temperature", 30.0, "FIRE's hot temperature.")
_FIRE_TOP_K = flags.DEFINE_integer("fire_top_k", 16, "FIRE's top-k at the hot steps.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 96, "Response cap in tokens.")
_NUM_SLOTS = flags.DEFINE_integer("num_slots", 64, "Decode slots of the sampling engine.")
_ARITH_SEED = flags.DEFINE_integer("arith_seed", 2, "Seed of generated arith problems.")
_ARITH_COUNT = flags.DEFINE_integer("arith_count", 256, "Generated arith problems.")
_ARITH_LEVELS = flags.DEFINE_list("arith_levels", ["1", "2", "3"], "arith difficulty levels.")
_TABLE = flags.DEFINE_string("table", "", "Markdown path of the pass@k table.")
_PLOT = flags.DEFINE_string("plot", "", "PNG path of the pass@k curves (the plot extra).")
flags.mark_flags_as_required(["checkpoint"])


def _check_flags() -> None:
  import os
  for checkpoint in _CHECKPOINT.value:
    if not os.path.exists(os.path.join(checkpoint, "config.json")):
      raise app.UsageError(f"--checkpoint={checkpoint} has no config.json.")
  if _SAMPLES.value < 1:
    raise app.UsageError(f"--samples={_SAMPLES.value} must be >= 1.")
  for mode in _FIRE.value:
    if mode not in FIRE_MODES:
      raise app.UsageError(f"--fire={mode!r} is not one of {', '.join(FIRE_MODES)}.")
  if _FIRE.value != ["none"] and _TEMPERATURE.value <= 0:
    raise app.UsageError("--fire needs --temperature > 0 (FIRE is a sampling mode).")


def _fire_schedule(mode: str):
  from rlhf_jax.sampling import FireSchedule
  if mode == "none":
    return None
  return FireSchedule(temperature=_FIRE_TEMPERATURE.value, top_k=_FIRE_TOP_K.value,
                      every_line=mode == "every_line")


def _evaluate(checkpoint: str, examples) -> dict[str, dict]:
  """evaluate_policy of one checkpoint under every --fire mode."""
  from rlhf_jax import models
  from rlhf_jax.data.prompts import PromptFormat
  from rlhf_jax.rewards.router import router_for_tasks
  from rlhf_jax.sampling import config as sampler_config_lib
  from rlhf_jax.training.evaluation import evaluate_policy
  model, params = models.load_hf_checkpoint(checkpoint)
  tokenizer = models.Tokenizer.from_directory(checkpoint)
  prompts = PromptFormat(tokenizer, models.load_prompt_prefix(checkpoint, tokenizer))
  longest = max(len(ids) for ids in prompts.encode_all(examples))
  bucket = 1 << (longest - 1).bit_length()
  sampler_config = sampler_config_lib.sampler_config(
      num_slots=_NUM_SLOTS.value, cache_length=bucket + _MAX_NEW_TOKENS.value,
      prompt_buckets=(bucket,))
  sampler_config.warmup = False  # one pass over the data: compile on first use
  sampler = sampler_config_lib.build_scheduler(sampler_config, model, params,
                                               tokenizer=tokenizer)
  scorer = router_for_tasks(sorted({e.task for e in examples}))
  return {mode: evaluate_policy(sampler, prompts, examples, scorer, samples=_SAMPLES.value, temperature=_TEMPERATURE.value,
                                max_new_tokens=_MAX_NEW_TOKENS.value, seed=_SEED.value,
                                fire=_fire_schedule(mode))
          for mode in _FIRE.value}


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  _check_flags()
  from rlhf_jax.data import read_jsonl
  from rlhf_jax.tasks import arith
  from rlhf_jax.analysis.report import passk_table
  from rlhf_jax.analysis.report import plot_passk

  if _DATA.value:
    examples = read_jsonl(_DATA.value)
  else:
    levels = tuple(int(level) for level in _ARITH_LEVELS.value)
    examples = arith.examples(_ARITH_SEED.value, _ARITH_COUNT.value, levels)
  by_mode = {mode: [] for mode in _FIRE.value}
  for checkpoint in _CHECKPOINT.value:
    for mode, result in _evaluate(checkpoint, examples).items():
      by_mode[mode].append(result)
      print(json.dumps({"checkpoint": checkpoint, "data": _DATA.value or "arith",
                        "temperature": _TEMPERATURE.value, "fire": mode, **result}),
            flush=True)
  if len(_CHECKPOINT.value) > 1 or len(_FIRE.value) > 1:
    table = passk_table(by_mode)
    print(table, end="")
    if _TABLE.value:
      with open(_TABLE.value, "w", encoding="utf-8") as f:
        f.write(table)
  if _PLOT.value and not plot_passk(by_mode, _PLOT.value):
    print("no plot: matplotlib is missing (pip install 'rlhf-jax[plot]')", flush=True)


if __name__ == "__main__":
  app.run(main)
