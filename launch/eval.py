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

Before any model loads, every checkpoint's files (config.json, the safetensors headers,
the tokenizer), --data (JSON, schema, a scorer for every row's task) and every prompt against each checkpoint's
tokenizer and --prompt_length (default 512 tokens) are checked: an error is one line naming the flag, file
and row, with exit status 2.
"""

from __future__ import annotations

import json

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
_PROMPT_LENGTH = flags.DEFINE_integer(
    "prompt_length", 512, "Longest prompt in tokens, prefix included: a longer row is an "
    "error (the cache grows with the longest prompt). 0: no cap.")
_NUM_SLOTS = flags.DEFINE_integer("num_slots", 64, "Decode slots of the sampling engine.")
_ARITH_SEED = flags.DEFINE_integer("arith_seed", 2, "Seed of generated arith problems.")
_ARITH_COUNT = flags.DEFINE_integer("arith_count", 256, "Generated arith problems.")
_ARITH_LEVELS = flags.DEFINE_list("arith_levels", ["1", "2", "3"], "arith difficulty levels.")
_TABLE = flags.DEFINE_string("table", "", "Markdown path of the pass@k table.")
_PLOT = flags.DEFINE_string("plot", "", "PNG path of the pass@k curves (the plot extra).")
flags.mark_flags_as_required(["checkpoint"])


def _check_flags() -> None:
  """ConfigErrors naming the flag: every checkpoint's files (file_checks), the counts."""
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.file_checks import check_checkpoint_dir
  for checkpoint in _CHECKPOINT.value:
    check_checkpoint_dir(checkpoint, f"--checkpoint={checkpoint}")
  for flag in (_SAMPLES, _MAX_NEW_TOKENS, _NUM_SLOTS, _ARITH_COUNT):
    if flag.value < 1:
      raise ConfigError(f"--{flag.name}={flag.value}: must be >= 1")
  if _PROMPT_LENGTH.value < 0:
    raise ConfigError(f"--prompt_length={_PROMPT_LENGTH.value}: must be >= 0 (0: no cap)")
  for mode in _FIRE.value:
    if mode not in FIRE_MODES:
      raise ConfigError(f"--fire={mode}: must be one of {', '.join(FIRE_MODES)}")
  if _FIRE.value != ["none"] and _TEMPERATURE.value <= 0:
    raise ConfigError(f"--fire={','.join(_FIRE.value)}: --fire needs --temperature > 0 "
                      "(FIRE is a sampling mode)")


def _examples() -> list[tuple[str, object]]:
  """(where, example) of --data, or of the generated arith problems; ConfigError naming
  --data and its line for a missing, empty or malformed file."""
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.data.jsonl import located_jsonl
  from rlhf_jax.tasks import arith
  if _DATA.value:
    try:
      located = located_jsonl(_DATA.value)
    except (OSError, ValueError) as error:
      raise ConfigError(f"--data={_DATA.value}: {error}") from None
    _check_tasks(located)
    return located
  try:
    levels = tuple(int(level) for level in _ARITH_LEVELS.value)
  except ValueError:
    raise ConfigError(f"--arith_levels={','.join(_ARITH_LEVELS.value)}: must be integers"
                      ) from None
  examples = arith.examples(_ARITH_SEED.value, _ARITH_COUNT.value, levels)
  return [(f"generated arith problem {i}", e) for i, e in enumerate(examples)]


def _check_tasks(located) -> None:
  """Every row's task has a rule scorer here (math's needs math-verify); else a
  ConfigError naming the row."""
  import importlib.util
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.tasks import registry
  for where, example in located:
    if not registry.is_known(example.task):
      raise ConfigError(f"--data: {where}: no scorer for task {example.task!r} (known: "
                        f"{', '.join(registry.known_tasks())})")
    if (registry.scored_by("math", [example.task])
        and importlib.util.find_spec("math_verify") is None):
      raise ConfigError(f"--data: {where}: task {example.task!r} is scored by math-verify, "
                        "which is not installed: pip install 'rlhf-jax[math]'")


def _prompts(checkpoint: str, located):
  """The checkpoint's PromptFormat, capped at --prompt_length, after its config.json is
  read as a model and every row is encoded and fits (else a ConfigError naming the
  checkpoint, or the row): before any model loads."""
  from rlhf_jax import models
  from rlhf_jax.config_errors import ConfigError
  from rlhf_jax.data.prompts import PromptError
  from rlhf_jax.data.prompts import PromptFormat
  try:
    models.read_hf_config(checkpoint)  # a family or option that cannot load
    tokenizer = models.Tokenizer.from_directory(checkpoint)
    prefix = models.load_prompt_prefix(checkpoint, tokenizer)
  except (OSError, ValueError, KeyError) as error:
    raise ConfigError(f"--checkpoint={checkpoint}: {error}") from None
  prompts = PromptFormat(tokenizer, tuple(prefix), prompt_length=_PROMPT_LENGTH.value,
                         length_name="--prompt_length")
  try:
    for row, example in located:
      prompts.encode(example, row)
  except PromptError as error:
    raise ConfigError(f"--data: {error}") from None
  return prompts


def _fire_schedule(mode: str):
  from rlhf_jax.sampling import FireSchedule
  if mode == "none":
    return None
  return FireSchedule(temperature=_FIRE_TEMPERATURE.value, top_k=_FIRE_TOP_K.value,
                      every_line=mode == "every_line")


def _evaluate(checkpoint: str, prompts, examples) -> dict[str, dict]:
  """evaluate_policy of one checkpoint (its PromptFormat: `_prompts`) under every --fire
  mode."""
  from rlhf_jax import models
  from rlhf_jax.rewards.router import router_for_tasks
  from rlhf_jax.sampling import config as sampler_config_lib
  from rlhf_jax.rollout.evaluation import evaluate_policy
  model, params = models.load_hf_checkpoint(checkpoint)
  tokenizer = prompts.tokenizer
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
  located = _examples()
  # Every checkpoint's tokenizer and prompt cap against every row, before any model loads.
  prompts = {checkpoint: _prompts(checkpoint, located) for checkpoint in _CHECKPOINT.value}
  from rlhf_jax.analysis.report import passk_table
  from rlhf_jax.analysis.report import plot_passk

  examples = [example for _, example in located]
  by_mode = {mode: [] for mode in _FIRE.value}
  for checkpoint in _CHECKPOINT.value:
    for mode, result in _evaluate(checkpoint, prompts[checkpoint], examples).items():
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
  from rlhf_jax import cli
  cli.run(main)
