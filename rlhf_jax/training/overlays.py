"""Overlays of a preset: `--config=configs/grpo.py:hf,cpu` builds the preset on the
task-neutral base (`hf`), then the `cpu` overlay shrinks it to two CPU cores, before the
command line's flags (which win); `configs/grpo.py:arith` builds it on the base with the
built-in task's overlay (`arith_overlay`: the task, its model from scratch, its sizes).
Every preset in configs/ takes them (`with_overlays` on its `get_config`)."""

from __future__ import annotations

import functools
from typing import Callable

import ml_collections


# The built-in arith task's run (`configs/<preset>.py:arith`, base_config("arith")): its
# problems generated, its warm start trained from scratch (a tiny model: no
# model.checkpoint), and the sizes, rates and evaluation a CPU trains it with in minutes.
ARITH_RUN = {"data.task": "arith", "data.prompt_length": 64, "model.logprob_chunk": 0,
             "rollout.prompts_per_step": 16, "rollout.max_new_tokens": 64,
             "sampler.num_slots": 64, "reward.judge_sampler.prompt_buckets": (128, 256),
             "reward.judge_sampler.cache_length": 256 + 8, "optimizer.learning_rate": 2e-4,
             "optimizer.warmup_steps": 5, "optimizer.critic_learning_rate": 1e-3,
             "train.steps": 60, "train.packing": False, "train.eval_every": 10,
             "train.eval_samples": 4}


def arith_overlay(c: ml_collections.ConfigDict) -> None:
  """Makes the task-neutral base the built-in arith task's run (`ARITH_RUN`); a preset
  built on it (`configs/<preset>.py:arith`) changes its own fields after."""
  c.update_from_flattened_dict(ARITH_RUN)


# The task-neutral base shrunk to two CPU cores (`configs/<preset>.py:hf,cpu`): fields and values.
# The KV cache and prompt buckets are derived from the new lengths (fit_sampler_sizes).
CPU_SIZES = {"data.prompt_length": 128, "rollout.prompts_per_step": 8,
             "rollout.max_new_tokens": 64, "sampler.num_slots": 64,
             "sampler.cache_length": 0, "sampler.prompt_buckets": (),
             "train.steps": 100, "train.eval_every": 20}


def cpu_overlay(c: ml_collections.ConfigDict) -> None:
  """Shrinks a preset on one's own data (empty `data.task`) to what two CPU cores train
  in minutes with a small model (`CPU_SIZES`: 128-token prompts, 8 prompts per step, 64
  new tokens, 64 slots, 100 steps); lengths a preset derived from the response cap
  (DAPO's overlong buffer, T-PPO's window) shrink with it in proportion. The group size
  stays the preset's."""
  if c.data.task:
    raise ValueError(f"config overlay 'cpu' applies to the hf base; data.task="
                     f"{c.data.task!r} (the built-in task's run) is sized for a CPU already.")
  scale = CPU_SIZES["rollout.max_new_tokens"] / c.rollout.max_new_tokens
  if c.algorithm.overlong.buffer:
    c.algorithm.overlong.buffer = max(1, int(c.algorithm.overlong.buffer * scale))
  c.rollout.windows.window_tokens = max(1, int(c.rollout.windows.window_tokens * scale))
  c.update_from_flattened_dict(CPU_SIZES)


OVERLAYS = {"cpu": cpu_overlay}


def with_overlays(get_config: Callable[[str], ml_collections.ConfigDict]
                  ) -> Callable[[str], ml_collections.ConfigDict]:
  """A preset's `get_config(base)` that also takes overlays after its base ('hf' or
  'arith'), `"hf,cpu"`: the preset is built on the base, then each overlay (`OVERLAYS`)
  changes it, before the command line's flags (which win). An unknown overlay is a ValueError
  naming the known ones."""
  @functools.wraps(get_config)
  def preset(spec: str | None = None) -> ml_collections.ConfigDict:
    if spec is None:  # the preset's own default base
      return get_config()
    base, *overlays = spec.split(",")
    for name in overlays:
      if name not in OVERLAYS:
        raise ValueError(f"config overlay {name!r} (in {spec!r}); allowed: "
                         f"{', '.join(OVERLAYS)}.")
    c = get_config(base)
    for name in overlays:
      OVERLAYS[name](c)
    return c
  return preset
