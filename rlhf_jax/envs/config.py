"""The `env` config section: the environment of multi-turn rollouts (`rollout.mode=
'multi_turn'`, rollout/multi_turn.py).

An episode is the prompt, then model turns and the environment's observations in turn,
until the environment says done, the model ends with EOS, `max_turns` model turns or
`max_tokens` tokens. `max_tokens` is the row's budget after the prompt (model and
observation tokens together: the batch's response columns R); `rollout.max_new_tokens`
caps one model turn.
"""

from __future__ import annotations

import ml_collections

from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of
from rlhf_jax.envs.base import load_factory
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section

# 'sum': the episode's score is the sum of its step rewards (plus the verifier's); 'turn':
# each step's reward sits on the last token of the model turn it answers (needs an advantage
# estimator that reads token rewards: its record's `reads_token_rewards`, e.g. gae).
REWARD_PLACEMENTS = ("sum", "turn")


def env_config() -> ml_collections.ConfigDict:
  """The `env` section with its defaults (one comment per field)."""
  e = ml_collections.ConfigDict()
  # "package.module:callable" returning a new environment (rlhf_jax.envs.Environment), one
  # per episode; rollout.mode 'multi_turn' needs it.
  e.factory = ""
  e.max_turns = 4  # Most model turns per episode.
  # The row's budget after the prompt: model and observation tokens (the response columns).
  e.max_tokens = 256
  e.timeout_s = 10.0  # Limit of one reset or step call (a worker is killed beyond it).
  e.workers = 2  # Environment worker processes.
  # A worker's resident memory, with the processes its environment started, in MB; past it
  # the worker is replaced and the call it ran fails ("memory"). 0 = no limit.
  e.worker_memory_mb = 4096
  # An observation may have this many characters per token left in the row; the worker
  # cuts a longer one (it cannot fit) and the episode ends as truncated.
  e.max_chars_per_token = 16
  e.reward_placement = "sum"  # 'sum' or 'turn' (see REWARD_PLACEMENTS).
  # Add the task's verifier score of the last model turn to the episode's reward (and take
  # its verdict as the episode's correctness).
  e.verifier = True
  # Text that ends a model turn without ending the episode (one token of the tokenizer, e.g.
  # '<|im_end|>'); '' = a turn ends only at EOS (and the episode then ends) or the turn cap.
  e.turn_end = ""
  return e


def check_env_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The trainer's `env` section, every field whatever the mode (a value set for another
  mode is still a typo); ConfigError naming the field. What episodes need of the other
  sections is `validate_episodes`."""
  del checking
  e = c.env
  for name in ("max_turns", "max_tokens", "workers", "max_chars_per_token"):
    value = e[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      invalid(f"env.{name}", value, "must be an int >= 1")
  memory = e.worker_memory_mb
  if not isinstance(memory, int) or isinstance(memory, bool) or memory < 0:
    invalid("env.worker_memory_mb", memory, "must be an int >= 0 (0: no limit)")
  check_range("env.timeout_s", e.timeout_s, low=0, low_open=True)
  one_of("env.reward_placement", e.reward_placement, REWARD_PLACEMENTS)


SECTION = Section("env", at="env", fields=env_config, check=check_env_section)


def validate_episodes(c: ml_collections.ConfigDict, *, reads_token_rewards: bool) -> None:
  """A run of episodes (a rollout mode that `needs_environment`: rollout/modes.py): the
  factory imports, and the other sections fit it. `reads_token_rewards`: the advantage
  estimator's capability (`ppo_config.reads_token_rewards`; envs/ sits below algorithms/
  and does not read the table, so the trainer's config passes it)."""
  e, r = c.env, c.rollout
  if not e.factory:
    invalid("env.factory", e.factory, "rollout.mode='multi_turn' needs an environment: "
            "'package.module:callable'")
  load_factory(e.factory)
  if c.reward.function and not e.verifier:
    invalid("reward.function", c.reward.function, "would never be called with "
            "env.verifier=False (the environment's rewards are the episode's reward); set "
            "env.verifier=True to add the function's score of the last model turn")
  if r.max_new_tokens > e.max_tokens:
    invalid("rollout.max_new_tokens", r.max_new_tokens, f"must be <= env.max_tokens="
            f"{e.max_tokens} (a model turn fits in the row's budget)")
  estimator = c.algorithm.advantage.estimator
  if e.reward_placement == "turn" and not reads_token_rewards:
    invalid("env.reward_placement", "turn", "needs an advantage estimator that reads "
            f"per-token rewards (e.g. gae, reinforce_pp); algorithm.advantage.estimator="
            f"{estimator!r} reads the episode's score only (use 'sum')")
  if e.reward_placement == "turn" and c.algorithm.process_reward.shaping != "none":
    invalid("algorithm.process_reward.shaping", c.algorithm.process_reward.shaping,
            "must be 'none' with env.reward_placement='turn' (turn rewards ride the "
            "step-reward channel and are not a PRM's scores to refine)")
  # The sampler's sizes for episodes (prompt + env.max_tokens, the conversation so far as a
  # later turn's prompt) are fitted with every other bound at once: training/config.py's
  # fit_sampler_sizes.


def turn_end_id(e: ml_collections.ConfigDict, tokenizer) -> int | None:
  """The token id of `env.turn_end` (None when empty); ConfigError unless it is one token."""
  if not e.turn_end:
    return None
  ids = tokenizer.encode(e.turn_end)
  if len(ids) != 1:
    invalid("env.turn_end", e.turn_end, f"must be one token of the policy's tokenizer; it "
            f"encodes to {len(ids)} ids {ids}")
  return ids[0]
