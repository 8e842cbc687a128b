"""Overlays of a preset's variant: `--config=configs/grpo.py:hf,cpu` builds the preset for
`hf`, then the `cpu` overlay shrinks it to two CPU cores, before the command line's flags
(which win). Every preset in configs/ takes them (`with_overlays` on its `get_config`)."""

from __future__ import annotations

import functools
from typing import Callable

import ml_collections


# The hf variant shrunk to two CPU cores (`configs/<preset>.py:hf,cpu`): fields and values.
# The KV cache and prompt buckets are derived from the new lengths (fit_sampler_sizes).
CPU_SIZES = {"data.prompt_length": 128, "rollout.prompts_per_step": 8,
             "rollout.max_new_tokens": 64, "sampler.num_slots": 64,
             "sampler.cache_length": 0, "sampler.prompt_buckets": (),
             "train.steps": 100, "train.eval_every": 20}


def cpu_overlay(c: ml_collections.ConfigDict) -> None:
  """Shrinks an hf preset to what two CPU cores train in minutes with a small model
  (`CPU_SIZES`: 128-token prompts, 8 prompts per step, 64 new tokens, 64 slots, 100
  steps); lengths a preset derived from the response cap (DAPO's overlong buffer, T-PPO's
  window) shrink with it in proportion. The group size stays the preset's."""
  if c.variant != "hf":
    raise ValueError(f"config overlay 'cpu' applies to the hf variant; {c.variant!r} is "
                     "sized for a CPU already.")
  scale = CPU_SIZES["rollout.max_new_tokens"] / c.rollout.max_new_tokens
  if c.algorithm.overlong.buffer:
    c.algorithm.overlong.buffer = max(1, int(c.algorithm.overlong.buffer * scale))
  c.rollout.windows.window_tokens = max(1, int(c.rollout.windows.window_tokens * scale))
  c.update_from_flattened_dict(CPU_SIZES)


OVERLAYS = {"cpu": cpu_overlay}


def with_overlays(get_config: Callable[[str], ml_collections.ConfigDict]
                  ) -> Callable[[str], ml_collections.ConfigDict]:
  """A preset's `get_config(variant)` that also takes overlays after the variant,
  `"hf,cpu"`: the preset is built for the variant, then each overlay (`OVERLAYS`) changes
  it, before the command line's flags (which win). An unknown overlay is a ValueError
  naming the known ones."""
  @functools.wraps(get_config)
  def preset(variant: str | None = None) -> ml_collections.ConfigDict:
    if variant is None:  # the preset's own default variant
      return get_config()
    base, *overlays = variant.split(",")
    for name in overlays:
      if name not in OVERLAYS:
        raise ValueError(f"config overlay {name!r} (in variant {variant!r}); allowed: "
                         f"{', '.join(OVERLAYS)}.")
    c = get_config(base)
    for name in overlays:
      OVERLAYS[name](c)
    return c
  return preset
