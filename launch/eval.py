r"""Evaluates checkpoints as train.py evaluates its held-out prompts, and reports what papers
report: greedy accuracy, avg@k, unbiased pass@k and maj@k, each with a bootstrap 95 %
interval, the response length, truncation and no-answer rates, a breakdown per task,
data_source and level, and the paired difference of two checkpoints.

  python launch/eval.py --config=configs/grpo.py:hf --config.data.eval_file=test.jsonl \
      --config.data.columns=prompt=question --config.data.default_task=math \
      --config.data.answer_format=gsm8k --checkpoint=/tmp/run/policy --samples=8 \
      --temperature=1.0 --output=eval.json --table=eval.md
  python launch/eval.py --config=configs/grpo.py:arith --checkpoint=/tmp/w/policy \
      --compare=/tmp/w/sft --samples=16 --temperature=1.0   # paired difference
  python launch/eval.py --checkpoint=/tmp/dapo/policy --data=held_out.jsonl --samples=8
  python launch/eval.py --checkpoint=A,B --samples=16 --temperature=1 \
      --fire=none,first_token,every_line --table=passk.md --plot=passk.png

With --config (a preset as train.py takes it, with the same --config.* overrides) the
held-out rows are read, rendered and scored exactly as train.py reads, renders and
scores them: `data.eval_file` (or the generated problems of the :arith preset, the same
seeds) with `data.columns`, `default_task`, `answer_format`, `chat_template`,
`system_prompt`; the run's reward section (`reward.function`, `reward.math_extractor`,
...) through rewards/build.py's evaluation scorer; the run's sampler, response cap
(`rollout.max_new_tokens`) and rollout mode (whole episodes for multi-turn). The
checkpoint replaces `model.checkpoint`; `--data=FILE` is `--config.data.eval_file=FILE`.
Without --config, --data / --arith_* / --max_new_tokens / --prompt_length /
--num_slots build the config instead (the task-neutral defaults with --data, else the
arith task's generated problems: --arith_seed S are those of a run with seed S - 2)
and the same code runs.

Greedy accuracy is one response per prompt at temperature 0 (train.py's
`eval_accuracy`); --samples=k --temperature=T then samples k responses per prompt for
avg@k (their mean verdict), pass@k' (Chen et al. 2021, for k' = 1, 2, 4, ..., k) and
maj@k (the majority of the answers the verifier read; rollout/eval_stats.py). Intervals:
problems resampled with replacement --resamples times (seed 0), the 2.5 and 97.5
percentiles. --compare=DIR evaluates DIR on the same problems and reports DIR minus the
first --checkpoint, problem by problem, with its interval. --fire compares sampling
modes (FIRE, Chen et al. arXiv:2410.21236). Printed: one JSON line per checkpoint and
mode (and per comparison), then a markdown table; --output writes the JSON, --table the
markdown.

Before any model loads, the config, every checkpoint's files (config.json, safetensors
headers, tokenizer) and every held-out row (JSON, schema, a scorer for its task, its
prompt against data.prompt_length with that checkpoint's tokenizer) are checked: an
error is one line naming the flag, field, file and row, with exit status 2.
--validate_only stops there: "config ok".
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

FIRE_MODES = ("none", "first_token", "every_line")
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Preset file (configs/*.py:arith or :hf[,cpu]), as train.py takes it.",
    lock_config=True)
_CHECKPOINT = flags.DEFINE_list("checkpoint", None, "HF checkpoint directories of policies.")
_COMPARE = flags.DEFINE_string("compare", "", "A checkpoint to compare with the first "
                               "--checkpoint on the same problems (paired difference).")
_DATA = flags.DEFINE_string("data", "", "Held-out JSONL/Parquet (= --config.data.eval_file; "
                            "without --config, default: generated arith problems).")
_SAMPLES = flags.DEFINE_integer("samples", 1, "Samples per prompt (k of avg@k, pass@k, maj@k).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0: greedy).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_FIRE = flags.DEFINE_list("fire", ["none"], f"Sampling modes, of {', '.join(FIRE_MODES)}.")
_FIRE_TEMPERATURE = flags.DEFINE_float("fire_temperature", 30.0, "FIRE's hot temperature.")
_FIRE_TOP_K = flags.DEFINE_integer("fire_top_k", 16, "FIRE's top-k at the hot steps.")
_RESAMPLES = flags.DEFINE_integer("resamples", 1000, "Bootstrap resamples of the intervals.")
_OUTPUT = flags.DEFINE_string("output", "", "JSON path of the results.")
_TABLE = flags.DEFINE_string("table", "", "Markdown path of the tables.")
_PLOT = flags.DEFINE_string("plot", "", "PNG path of the pass@k curves (the plot extra).")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the flags, config, "
                                   "checkpoints and data, print 'config ok' and exit.")
# The form without --config: these build the config (with --config, its fields do).
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 96, "Response cap in tokens.")
_PROMPT_LENGTH = flags.DEFINE_integer("prompt_length", 512,
                                      "Longest prompt in tokens, prefix included.")
_NUM_SLOTS = flags.DEFINE_integer("num_slots", 64, "Decode slots of the sampling engine.")
_ARITH_SEED = flags.DEFINE_integer("arith_seed", 2, "Seed of generated arith problems.")
_ARITH_COUNT = flags.DEFINE_integer("arith_count", 256, "Generated arith problems.")
_ARITH_LEVELS = flags.DEFINE_list("arith_levels", ["1", "2", "3"], "arith difficulty levels.")
flags.mark_flags_as_required(["checkpoint"])
# Each flag of the form without --config and the field it sets.
FLAG_FIELDS = {"max_new_tokens": "rollout.max_new_tokens", "prompt_length": "data.prompt_length",
               "num_slots": "sampler.num_slots", "arith_seed": "seed",
               "arith_count": "data.num_eval", "arith_levels": "data.levels"}


def _check_flags() -> None:
  """ConfigErrors naming the flag: counts, sampling modes, a flag of the form without
  --config given with --config (its field is the one place)."""
  from rlhf_jax.config_errors import ConfigError
  for flag in (_SAMPLES, _MAX_NEW_TOKENS, _NUM_SLOTS, _ARITH_COUNT, _RESAMPLES,
               _PROMPT_LENGTH):
    if flag.value < 1:
      raise ConfigError(f"--{flag.name}={flag.value}: must be >= 1")
  for mode in _FIRE.value:
    if mode not in FIRE_MODES:
      raise ConfigError(f"--fire={mode}: must be one of {', '.join(FIRE_MODES)}")
  if _FIRE.value != ["none"] and _TEMPERATURE.value <= 0:
    raise ConfigError(f"--fire={','.join(_FIRE.value)}: --fire needs --temperature > 0 "
                      "(FIRE is a sampling mode)")
  if _CONFIG.value is not None:
    for name, field in FLAG_FIELDS.items():
      if flags.FLAGS[name].present:
        raise ConfigError(f"--{name}: not with --config; set --config.{field} (the field "
                          "train.py reads)")


def _flag_config():
  """The config of the form without --config: the task-neutral defaults reading --data,
  or the arith task's generated problems (--arith_*), sized by the flags."""
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.training.config import base_config
  c = base_config("hf" if _DATA.value else "arith")
  c.data.prompt_length = _PROMPT_LENGTH.value
  c.rollout.max_new_tokens = _MAX_NEW_TOKENS.value
  c.sampler.num_slots = _NUM_SLOTS.value
  c.sampler.cache_length, c.sampler.prompt_buckets = 0, ()  # derived from the two above
  c.sampler.warmup = False  # one pass over the data: compile on first use
  if not _DATA.value:
    try:
      levels = tuple(int(level) for level in _ARITH_LEVELS.value)
    except ValueError:
      raise ConfigError(f"--arith_levels={','.join(_ARITH_LEVELS.value)}: must be integers"
                        ) from None
    if _ARITH_SEED.value < 2:
      raise ConfigError(f"--arith_seed={_ARITH_SEED.value}: must be >= 2 (the held-out "
                        "problems of a run with config.seed = S are seed S + 2's)")
    c.seed = _ARITH_SEED.value - 2  # inputs.load_examples generates seed + 2's problems
    c.data.num_eval, c.data.levels = _ARITH_COUNT.value, levels
    c.data.level_weights = (1.0,) * len(levels)
  return c


def _named_by_flags(error):
  """A ConfigError of the form without --config names the flag that set the field."""
  from rlhf_jax.config_errors import ConfigError
  if _CONFIG.value is not None:
    return error
  text = str(error)
  for field, flag in (("data.eval_file", "data"), *((f, n) for n, f in FLAG_FIELDS.items())):
    text = text.replace(f"config.{field}:", f"--{flag}:")
  return ConfigError(text)


def _run_config(checkpoint: str):
  """The config that evaluates `checkpoint`, validated as train.py validates its own (the
  sampler's sizes derived): --config and its overrides (or `_flag_config`), the
  checkpoint as model.checkpoint, --data as data.eval_file."""
  import os
  import jax
  from rlhf_jax.config_errors import invalid
  from rlhf_jax.config_errors import unfit
  from rlhf_jax.training.config import validate_config
  c = (_CONFIG.value if _CONFIG.value is not None else _flag_config()
       ).copy_and_resolve_references()
  c.model.checkpoint = checkpoint
  if _DATA.value:
    c.data.eval_file = _DATA.value
  if not c.data.task and not c.data.eval_file:
    unfit("data.eval_file", "empty: eval.py evaluates held-out rows "
          "(--config.data.eval_file=FILE or --data=FILE)")
  if c.data.eval_file and not os.path.isfile(c.data.eval_file):
    invalid("data.eval_file", c.data.eval_file, "must be an existing .jsonl/.parquet file")
  if not c.data.task and not c.data.train_file:
    # train.py's check asks for a prompt file; eval.py reads only data.eval_file.
    c.data.train_file = c.data.eval_file
  validate_config(c, num_devices=jax.device_count())
  return c


def _held_out(c, checkpoint: str):
  """(the held-out examples, the PromptFormat) of `checkpoint` under config `c`, read and
  checked as train.py reads them (training/inputs.load_examples: every row's JSON,
  schema, task and prompt length with the checkpoint's tokenizer), before any model
  loads; the checkpoint's files and the reward's checkpoints are checked first."""
  from rlhf_jax import models
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.config_errors import unfit
  from rlhf_jax.models.hf import checks as checkpoint_checks
  from rlhf_jax.training import build
  from rlhf_jax.training import inputs
  checkpoint_checks.check_checkpoint_dir(checkpoint, f"--checkpoint={checkpoint}")
  inputs.check_checkpoint_family(checkpoint)
  try:
    tokenizer = models.Tokenizer.from_directory(checkpoint)
    prefix = models.load_prompt_prefix(checkpoint, tokenizer)
  except (OSError, ValueError) as error:
    raise ConfigError(f"--checkpoint={checkpoint}: the tokenizer does not load: {error}"
                      ) from None
  inputs.check_reward_checkpoints(c)
  prompts = build.prompt_format(c, tokenizer, prefix)
  held_out_only = c.copy_and_resolve_references()
  held_out_only.data.train_file, held_out_only.data.num_train = "", 1
  _, held_out = inputs.load_examples(held_out_only, prompts)
  if not held_out:
    unfit("data.eval_file", "no held-out rows to evaluate")
  return held_out


def _fire_schedule(mode: str):
  from rlhf_jax.sampling import FireSchedule
  if mode == "none":
    return None
  return FireSchedule(temperature=_FIRE_TEMPERATURE.value, top_k=_FIRE_TOP_K.value,
                      every_line=mode == "every_line")


def _evaluate(c, held_out) -> tuple[object, dict[str, tuple[dict, object]]]:
  """(greedy (figures, table), mode → sampled (figures, table)) of `c.model.checkpoint`:
  the policy, sampler, scorer and evaluator built as the trainer builds them
  (training/build.py, rewards/build.py), so the figures are train.py's."""
  import inspect
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.rewards import build as reward_build
  from rlhf_jax.rollout import modes as rollout_modes
  from rlhf_jax.training import build
  if _FIRE.value != ["none"] and rollout_modes.rollout_mode(c).needs_environment:
    raise ConfigError(f"--fire={','.join(_FIRE.value)}: FIRE samples single responses; "
                      f"rollout mode {rollout_modes.rollout_mode(c).name!r} runs whole "
                      "episodes")
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, "", mesh)
  tasks = sorted({e.task for e in held_out})
  scorer = reward_build.training_scorer(c, tasks, mesh, policy.prompts)
  eval_scorer = reward_build.evaluation_scorer(c, scorer, tasks)
  sampler = build.build_sampler(c, policy, mesh)
  parts = build.rollout_parts(c, policy, sampler, scorer)
  try:
    evaluate = build.build_evaluator(c, parts, held_out, eval_scorer)
    if "details" not in inspect.signature(evaluate).parameters:  # a mode of one's own
      raise ConfigError(f"rollout mode {rollout_modes.rollout_mode(c).name!r}: its evaluator "
                        "takes no details=True (the per-sample table eval.py reports from; "
                        "rollout/evaluation.py's evaluate_policy gives one)")
    greedy = evaluate(samples=1, temperature=0.0, details=True)  # the trainer's call
    sampled = {}
    for mode in _FIRE.value:
      if mode == "none" and _SAMPLES.value == 1 and _TEMPERATURE.value == 0:
        sampled[mode] = greedy
        continue
      fire = {} if mode == "none" else {"fire": _fire_schedule(mode)}
      sampled[mode] = evaluate(samples=_SAMPLES.value, temperature=_TEMPERATURE.value,
                               seed=_SEED.value, details=True, **fire)
    return greedy, sampled
  finally:
    parts.close()
    sampler.close()
    for one in {id(s): s for s in (scorer, eval_scorer)}.values():
      one.close()


def _report(greedy, sampled) -> dict:
  """eval_stats.report of one checkpoint and mode, with the evaluator's other figures
  (accuracy per group, episode turns)."""
  from rlhf_jax.rollout import eval_stats
  figures, table = sampled
  out = eval_stats.report(table, greedy=greedy[1], resamples=_RESAMPLES.value)
  out.update({k: v for k, v in figures.items() if k not in out})
  if not table.has_answers():  # said, not left out without a word
    out["notes"] = [f"no maj@{table.samples}: the scorer read no final answer from any "
                    "sample (the rule verifiers read them; a reward function or model "
                    "does not)"]
  return out


def main(argv) -> None:
  del argv
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  _check_flags()
  checkpoints = list(_CHECKPOINT.value) + ([_COMPARE.value] if _COMPARE.value else [])
  # Every checkpoint's config, files and rows, before any model loads.
  prepared = {}
  try:
    for checkpoint in checkpoints:
      c = _run_config(checkpoint)
      prepared[checkpoint] = (c, _held_out(c, checkpoint))
  except ConfigError as error:
    raise _named_by_flags(error) from None
  if _VALIDATE_ONLY.value:
    print("config ok", flush=True)
    return
  from rlhf_jax.analysis.report import passk_table
  from rlhf_jax.analysis.report import plot_passk
  from rlhf_jax.rollout import eval_stats

  c0 = prepared[checkpoints[0]][0]
  data = c0.data.eval_file or f"generated {c0.data.task} problems"
  lines, rows, by_mode, tables = [], {}, {mode: [] for mode in _FIRE.value}, {}
  for checkpoint in checkpoints:
    greedy, sampled = _evaluate(*prepared[checkpoint])
    for mode, result in sampled.items():
      tables[checkpoint, mode] = (greedy[1], result[1])
      report = _report(greedy, result)
      if checkpoint in _CHECKPOINT.value:
        by_mode[mode].append(report)
      rows[checkpoint if len(_FIRE.value) == 1 else f"{checkpoint} ({mode})"] = report
      lines.append({"checkpoint": checkpoint, "data": data, "temperature": _TEMPERATURE.value,
                    "fire": mode, **report})
      print(json.dumps(lines[-1]), flush=True)
  if _COMPARE.value:
    base = _CHECKPOINT.value[0]
    for mode in _FIRE.value:
      (greedy_a, a), (greedy_b, b) = tables[base, mode], tables[_COMPARE.value, mode]
      difference = eval_stats.paired_difference(a, b, greedy=(greedy_a, greedy_b),
                                                resamples=_RESAMPLES.value)
      rows[f"{_COMPARE.value} − {base}" + (f" ({mode})" if len(_FIRE.value) > 1 else "")] = (
          difference)
      lines.append({"compare": _COMPARE.value, "against": base, "data": data, "fire": mode,
                    "difference": difference})
      print(json.dumps(lines[-1]), flush=True)
  table = eval_stats.markdown_table(rows)
  if len(_CHECKPOINT.value) > 1 or len(_FIRE.value) > 1:
    table += "\n" + passk_table(by_mode)
  print(table, end="")
  if _TABLE.value:
    with open(_TABLE.value, "w", encoding="utf-8") as f:
      f.write(table)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w", encoding="utf-8") as f:
      json.dump(lines, f, indent=1)
  if _PLOT.value and not plot_passk(by_mode, _PLOT.value):
    print("no plot: matplotlib is missing (pip install 'rlhf-jax[plot]')", flush=True)


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
