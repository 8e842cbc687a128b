"""The `rollout` config section: how prompts become a step's training batch.

The fields of every mode live here; what a mode is (how it builds, its response length,
its own rules) is its record in rollout/modes.py, the one module that reads `rollout.mode`.
"""

from __future__ import annotations

import ml_collections

from rlhf_jax.config_errors import at_least
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section
from rlhf_jax.sampling import FireSchedule
from rlhf_jax.sampling import SamplingParams


def rollout_config(*, prompts_per_step: int = 128, max_new_tokens: int = 1024
                   ) -> ml_collections.ConfigDict:
  """The `rollout` section with its defaults (one comment per field)."""
  r = ml_collections.ConfigDict()
  # 'groups', 'dynamic' (DAPO dynamic sampling), 'windows' (T-PPO), 'multi_turn' (episodes
  # with the `env` section's environment) or 'offline' (data.offline_file's labelled
  # groups: DPO, DQO), or one registered with rollout/modes.py's `register_rollout_mode`
  # ('package.module:NAME' of a RolloutMode imports it).
  r.mode = "groups"
  r.prompts_per_step = prompts_per_step  # Prompts (groups) per training step.
  r.group_size = 8  # G: samples per prompt.
  # R: response cap (tokens); with mode 'multi_turn' the cap of one model turn (the row's
  # budget is env.max_tokens).
  r.max_new_tokens = max_new_tokens
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
  # What makes a group worth training on: 'reward' (its rewards are not all equal, verl's
  # std > 0) or 'accuracy' (its correctness varies: the verifier's verdict, or a reward
  # function's own 'acc'; DAPO's paper).
  r.dynamic.signal = "reward"
  # Keep surplus qualified groups for later steps (OpenRLHF) instead of discarding them
  # (verl, the default); kept groups are stale, corrected by algorithm.staleness.
  r.dynamic.keep_surplus = False
  r.dynamic.max_age = 1  # keep_surplus: drop buffered groups older than this many versions.
  # Generation runs up to this many policy versions ahead of the learner (rollout/pipelined.py;
  # decoupled PPO corrects the stale tokens). 0: generate, then learn, in turn.
  r.max_staleness = 0
  # Partial rollouts (max_staleness > 0): new weights reach the samples in flight at the
  # sampler's next decode step (interruptible generation; sampler.update_policy
  # 'swap_now'), each token keeping the version that sampled it. The swap point follows
  # the threads' timing, so such a run is not bit-reproducible. False: a batch samples
  # with the one version it was given.
  r.partial_rollouts = False
  # Who computes the reference log-probs of the KL term: 'trainer' (a frozen copy on the
  # trainer's devices) or 'sampler' (the sampling servers, which keep the reference
  # weights and score each batch on the generation thread: rollout/reference.py).
  r.reference_logprobs = "trainer"
  r.windows = ml_collections.ConfigDict()  # mode 'windows'
  r.windows.window_tokens = 32  # W: new tokens per response per step (paper: a third of R).
  return r


def validate_rollout_config(r: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the `rollout.*` field of an impossible setting. Every
  field is checked whatever the mode (a value set for another mode is still a typo),
  and the sampling fields with SamplingParams' ranges, before the first rollout; the
  mode's own rules are `modes.validate_mode`'s."""
  at_least(r, "rollout", ("prompts_per_step", "group_size", "max_new_tokens"))
  check_range("rollout.temperature", r.temperature, low=0, note="(0: greedy)")
  check_range("rollout.top_p", r.top_p, low=0, high=1, low_open=True, note="(1: no limit)")
  check_range("rollout.top_k", r.top_k, low=0, note="(0: no limit)")
  check_range("rollout.fire_temperature", r.fire_temperature, low=0, low_open=True)
  check_range("rollout.fire_top_k", r.fire_top_k, low=0, note="(0: no top-k)")
  at_least(r.dynamic, "rollout.dynamic", ("oversample", "max_rounds"))
  one_of("rollout.dynamic.signal", r.dynamic.signal, ("reward", "accuracy"))
  check_range("rollout.dynamic.max_age", r.dynamic.max_age,
              low=1 if r.dynamic.keep_surplus else 0,
              note="with rollout.dynamic.keep_surplus (a kept group is at least one policy "
              "version old when used; to drop the surplus set keep_surplus=False)"
              if r.dynamic.keep_surplus else "")
  check_range("rollout.windows.window_tokens", r.windows.window_tokens, low=1)
  if not isinstance(r.max_staleness, int) or r.max_staleness < 0:
    invalid("rollout.max_staleness", r.max_staleness, "must be an int >= 0 (0: synchronous)")
  if r.max_staleness and r.dynamic.keep_surplus and r.dynamic.max_age <= r.max_staleness:
    invalid("rollout.dynamic.max_age", r.dynamic.max_age, f"must be > rollout.max_staleness="
            f"{r.max_staleness} with keep_surplus (a kept group is then at least "
            f"{r.max_staleness + 1} versions old when used)")
  if r.partial_rollouts and not r.max_staleness:
    invalid("rollout.partial_rollouts", True, "needs rollout.max_staleness >= 1 (weights "
            "change under samples in flight only when generation runs ahead)")


def sampling_params(r: ml_collections.ConfigDict, stop_token_ids: tuple[int, ...]
                    ) -> SamplingParams:
  """The training SamplingParams of the section (n = G; seeds are set per call)."""
  fire = FireSchedule(temperature=r.fire_temperature, top_k=r.fire_top_k) if r.fire else None
  return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                        max_new_tokens=r.max_new_tokens, stop_token_ids=stop_token_ids,
                        n=r.group_size, fire=fire)


def check_rollout_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The trainer's `rollout` section, every field (the mode's own rules: rollout/modes.py's
  section)."""
  del checking
  validate_rollout_config(c.rollout)


SECTION = Section("rollout", at="rollout", fields=rollout_config, check=check_rollout_section)
