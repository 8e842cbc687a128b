"""The `rollout` config section: how prompts become a step's training batch.

Modes: "groups" (G samples of each of `prompts_per_step` prompts), "dynamic"
(DAPO's dynamic sampling over groups), "windows" (T-PPO's in-flight responses, W
tokens per step) and "offline" (labelled groups from a file: rollout/offline.py,
built by training/build.py since it reads no sampler).
"""

from __future__ import annotations

import ml_collections

from rlhf_jax.config_errors import fail
from rlhf_jax.data import PromptStream
from rlhf_jax.rollout.generation import GroupGenerator
from rlhf_jax.rollout.groups import DynamicSamplingRollout
from rlhf_jax.rollout.groups import GroupRollout
from rlhf_jax.rollout.windows import WindowRollout
from rlhf_jax.rollout.windows import longest_request_prompt
from rlhf_jax.sampling import FireSchedule
from rlhf_jax.sampling import SamplingParams

MODES = ("groups", "dynamic", "windows", "offline")


def rollout_config(*, prompts_per_step: int, max_new_tokens: int) -> ml_collections.ConfigDict:
  """The `rollout` section with its defaults (one comment per field)."""
  r = ml_collections.ConfigDict()
  # 'groups', 'dynamic' (DAPO dynamic sampling), 'windows' (T-PPO) or 'offline'
  # (data.offline_file's labelled groups: DPO, DQO).
  r.mode = "groups"
  r.prompts_per_step = prompts_per_step  # Prompts (groups) per training step.
  r.group_size = 8  # G: samples per prompt.
  r.max_new_tokens = max_new_tokens  # R: response cap (tokens).
  r.stop_at_eos = True  # End a response at the EOS token (False: always max_new_tokens).
  r.temperature = 1.0  # Sampling temperature during training (RL: 1.0).
  r.top_p = 1.0  # Nucleus sampling during training.
  r.top_k = 0  # Top-k during training (0: none).
  r.fire = False  # FIRE: first response token at fire_temperature / fire_top_k.
  r.fire_temperature = 30.0  # FIRE hot temperature (paper: 30).
  r.fire_top_k = 16  # FIRE hot top-k (paper: 16).
  r.dynamic = ml_collections.ConfigDict()  # mode 'dynamic'
  r.dynamic.oversample = 3  # Prompts per round = oversample × prompts_per_step (verl 3×).
  r.dynamic.max_rounds = 10  # Fruitless rounds in a row before giving up (verl max_num_gen_batches).
  r.windows = ml_collections.ConfigDict()  # mode 'windows'
  r.windows.window_tokens = 32  # W: new tokens per response per step (paper: a third of R).
  return r


def validate_rollout_config(r: ml_collections.ConfigDict, *, prompt_length: int,
                            prompt_buckets: tuple[int, ...]) -> None:
  """Raises ConfigError naming the `rollout.*` field of an impossible setting."""
  if r.mode not in MODES:
    fail("rollout.mode", f"={r.mode!r} is not one of {', '.join(MODES)}")
  for field in ("prompts_per_step", "group_size", "max_new_tokens"):
    if r[field] < 1:
      fail(f"rollout.{field}", f"={r[field]} must be >= 1")
  if r.mode == "dynamic":
    if r.group_size < 2:
      fail("rollout.group_size", f"={r.group_size} must be >= 2 for mode 'dynamic' (it keeps "
           "groups whose correctness varies)")
    for field in ("oversample", "max_rounds"):
      if r.dynamic[field] < 1:
        fail(f"rollout.dynamic.{field}", f"={r.dynamic[field]} must be >= 1")
  if r.mode == "windows":
    w = r.windows.window_tokens
    if w < 1:
      fail("rollout.windows.window_tokens", f"={w} must be >= 1")
    # A continued response is re-sent as prompt + tokens so far.
    longest = longest_request_prompt(prompt_length, r.max_new_tokens, w)
    if longest > max(prompt_buckets):
      fail("sampler.prompt_buckets", f"={tuple(prompt_buckets)} must reach {longest} tokens "
           f"with rollout.windows.window_tokens={w} (a continued response is sent as "
           "prompt + the tokens so far)")
  if r.fire and r.fire_temperature <= 0:
    fail("rollout.fire_temperature", f"={r.fire_temperature} must be > 0")
  if r.fire and r.fire_top_k < 0:
    fail("rollout.fire_top_k", f"={r.fire_top_k} must be >= 0 (0: no top-k)")


def sampling_params(r: ml_collections.ConfigDict, stop_token_ids: tuple[int, ...]
                    ) -> SamplingParams:
  """The training SamplingParams of the section (n = G; seeds are set per call)."""
  fire = FireSchedule(temperature=r.fire_temperature, top_k=r.fire_top_k) if r.fire else None
  return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                        max_new_tokens=r.max_new_tokens, stop_token_ids=stop_token_ids,
                        n=r.group_size, fire=fire)


def build_rollout(r: ml_collections.ConfigDict, generator: GroupGenerator,
                  stream: PromptStream):
  """The rollout of `r.mode` (an object with `collect() -> Rollouts`, `state()`,
  `restore(state)`)."""
  if r.mode == "windows":
    return WindowRollout(generator, stream, prompts_per_step=r.prompts_per_step,
                         group_size=r.group_size, window_tokens=r.windows.window_tokens,
                         response_length=r.max_new_tokens)
  if r.mode == "dynamic":
    return DynamicSamplingRollout(generator, stream, prompts_per_step=r.prompts_per_step,
                                  response_length=r.max_new_tokens,
                                  oversample=r.dynamic.oversample,
                                  max_rounds=r.dynamic.max_rounds)
  return GroupRollout(generator, stream, prompts_per_step=r.prompts_per_step,
                      response_length=r.max_new_tokens)
