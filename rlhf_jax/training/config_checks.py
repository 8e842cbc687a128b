"""Validation of the trainer config's own sections: model, data, sft, the rule-verifier
part of reward, optimizer, train and mesh.

The sections owned elsewhere are checked by their modules (algorithms/ppo_config.py,
dpo.py, dqo.py, rollout/config.py, sampling/config.py, rewards/config.py);
`training.config.validate_config` runs all of them and the checks across sections.
Every check raises a ConfigError, `config.<path>: invalid value <v>: <allowed>`.
"""

from __future__ import annotations

import math
import os
import re

import ml_collections

from rlhf_jax import parallel
from rlhf_jax.config_errors import at_least
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of
from rlhf_jax.data.curriculum import parse_curriculum
from rlhf_jax.data.sources import FIELDS as SOURCE_FIELDS
from rlhf_jax.models.config import DTYPES
from rlhf_jax.models.config import MATMUL_PRECISIONS
from rlhf_jax.rewards.sandbox import ISOLATIONS
from rlhf_jax.tasks.arith import LEVELS as ARITH_LEVELS

GENERATED_TASKS = ("arith", "pycalc")  # data.task of the arith variant
MATH_EXTRACTORS = ("auto", "boxed", "answer_line", "gsm8k", "last_number")
SCHEDULES = ("constant", "cosine")
_SEED_MAX = 2**32 - 1  # numpy and the sampler take 32-bit seeds


def check_finite(config: ml_collections.ConfigDict, prefix: str = "") -> None:
  """Every float field (and float in a tuple field) of `config` is finite."""
  for name, value in config.items():
    path = f"{prefix}{name}"
    if isinstance(value, ml_collections.ConfigDict):
      check_finite(value, f"{path}.")
    elif isinstance(value, (float, tuple)):
      values = value if isinstance(value, tuple) else (value,)
      if any(isinstance(v, float) and not math.isfinite(v) for v in values):
        invalid(path, value, "must be finite")


def validate_model(c) -> None:
  """`model.*`: dtypes, precisions, and the tiny arith model's shape."""
  m = c.model
  one_of("model.dtype", m.dtype, DTYPES)
  one_of("model.matmul_precision", m.matmul_precision, MATMUL_PRECISIONS)
  at_least(m, "model", ("hidden_size", "num_layers", "num_heads"))
  if c.variant == "arith":
    head_dim = m.hidden_size // m.num_heads
    if m.hidden_size % m.num_heads or head_dim % 2:
      invalid("model.hidden_size", m.hidden_size, f"must be model.num_heads={m.num_heads} × "
              "an even head width (RoPE rotates pairs)")


def validate_data(c) -> None:
  """`data.*`: the task, levels, counts, files and the column and curriculum texts."""
  d = c.data
  one_of("data.task", d.task, GENERATED_TASKS)
  _check_levels("data", d.levels, d.level_weights)
  at_least(d, "data", ("num_train", "num_eval", "prompt_length", "offline_prompts",
                       "offline_samples"))
  for field in ("train_file", "eval_file"):
    if d[field] and not os.path.isfile(d[field]):
      invalid(f"data.{field}", d[field], "must be an existing .jsonl/.parquet file (or empty: "
              "generated problems for arith)")
  parse_columns(d.columns)
  if d.curriculum:
    parse_curriculum(d.curriculum)


def parse_columns(text: str) -> dict[str, str]:
  """`data.columns` ("answer=reward_model.ground_truth,task=data_source") as a mapping."""
  mapping = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    field, _, path = item.partition("=")
    if field.strip() not in SOURCE_FIELDS or not path.strip():
      invalid("data.columns", text, f"{item!r} must be field=column with field one of "
              f"{', '.join(SOURCE_FIELDS)}")
    mapping[field.strip()] = path.strip()
  return mapping


def validate_sft(sft) -> None:
  """`sft.*`: the arith warm start."""
  at_least(sft, "sft", ("steps", "batch_size"))
  check_range("sft.learning_rate", sft.learning_rate, low=0, low_open=True)
  _check_levels("sft", sft.levels, sft.level_weights)
  for field in ("direct_fraction", "carry_slip"):
    check_range(f"sft.{field}", sft[field], low=0, high=1)


def _check_levels(prefix: str, levels, weights) -> None:
  if not levels or any(level not in ARITH_LEVELS for level in levels):
    invalid(f"{prefix}.levels", levels, "must be a non-empty tuple of arith levels, each one "
            f"of {', '.join(map(str, sorted(ARITH_LEVELS)))}")
  if len(weights) != len(levels):
    invalid(f"{prefix}.level_weights", weights, f"must have one weight per {prefix}.levels "
            f"({len(levels)})")
  if any(not weight > 0 for weight in weights):
    invalid(f"{prefix}.level_weights", weights, "must all be > 0")


def validate_rule_rewards(r) -> None:
  """The rule verifiers' part of `reward.*` (rewards/config.py checks the models)."""
  check_range("reward.timeout_s", r.timeout_s, low=0, low_open=True)
  check_range("reward.workers", r.workers, low=1)
  check_range("reward.sandbox.timeout_s", r.sandbox.timeout_s, low=0, low_open=True)
  check_range("reward.sandbox.workers", r.sandbox.workers, low=0, note="(0: 4 per core)")
  check_range("reward.sandbox.memory_mb", r.sandbox.memory_mb, low=64)
  one_of("reward.sandbox.isolation", r.sandbox.isolation, ISOLATIONS)
  extractor = r.math_extractor
  if not extractor.startswith("re:"):
    if extractor not in MATH_EXTRACTORS:
      invalid("reward.math_extractor", extractor, f"must be one of "
              f"{', '.join(MATH_EXTRACTORS)} or 're:<regex with one group>'")
    return
  try:
    groups = re.compile(extractor[3:]).groups
  except re.error as error:
    invalid("reward.math_extractor", extractor, f"is not a valid regex ({error})")
  if groups < 1:
    invalid("reward.math_extractor", extractor, "must have a group (the answer)")


def validate_optimizer(o) -> None:
  """`optimizer.*`: rates, schedule, decay and clipping."""
  for field in ("learning_rate", "critic_learning_rate", "max_grad_norm"):
    check_range(f"optimizer.{field}", o[field], low=0, low_open=True)
  check_range("optimizer.warmup_steps", o.warmup_steps, low=0)
  check_range("optimizer.weight_decay", o.weight_decay, low=0)
  one_of("optimizer.schedule", o.schedule, SCHEDULES)
  check_range("optimizer.final_fraction", o.final_fraction, low=0, high=1)


def validate_train(c, *, rows: int) -> None:
  """`train.*` and `seed`; `rows` = rollouts per step, split into mini- and micro-batches."""
  check_range("seed", c.seed, low=0, high=_SEED_MAX)
  at_least(c.train, "train", ("steps", "epochs", "minibatches", "micro_batches", "eval_every",
                              "checkpoint_every", "log_every"))
  check_range("train.eval_samples", c.train.eval_samples, low=0, note="(0: no sampled eval)")
  if rows % c.train.minibatches:
    invalid("train.minibatches", c.train.minibatches, f"must divide the {rows} rollouts per "
            "step (rollout.prompts_per_step × rollout.group_size)")
  if (rows // c.train.minibatches) % c.train.micro_batches:
    invalid("train.micro_batches", c.train.micro_batches, "must divide the "
            f"{rows // c.train.minibatches} rows of a mini-batch")


def validate_mesh(c, num_devices: int | None, *, rows: int) -> None:
  """`mesh.*`: axis sizes; with `num_devices`, that they fit and split the batch evenly."""
  sizes = {"data": c.mesh.data, "fsdp": c.mesh.fsdp, "tensor": c.mesh.tensor}
  for axis, size in sizes.items():
    if size < 1 and size != -1:
      invalid(f"mesh.{axis}", size, "must be >= 1, or -1 (the devices left)")
  if list(sizes.values()).count(-1) > 1:
    invalid("mesh", sizes, "at most one axis may be -1")
  if num_devices is None:
    return
  product = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
  if -1 not in sizes.values() and product > num_devices:
    invalid("mesh", sizes, f"data×fsdp×tensor = {product} must be <= the {num_devices} "
            "available devices")
  try:
    resolved = parallel.resolve_axis_sizes(sizes, num_devices if -1 in sizes.values()
                                           else product)
  except ValueError as error:
    invalid("mesh", sizes, str(error).rstrip("."))
  batch_shards = resolved["data"] * resolved["fsdp"]
  if rows % batch_shards:
    invalid("rollout.prompts_per_step", c.rollout.prompts_per_step, f"the {rows} rollouts "
            f"per step (× rollout.group_size={c.rollout.group_size}) must split evenly over "
            f"mesh data×fsdp = {batch_shards}")
