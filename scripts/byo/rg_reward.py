"""reasoning-gym's own scoring as a TRL-signature reward function for rlhf_jax:
`--config.reward.function=scripts/byo/rg_reward.py:rg_score`. It reads the file's own
columns `rg_dataset` and `rg_entry` (scripts/byo/reasoning_gym_data.py writes them)."""

import json


def rg_score(prompts, completions, rg_dataset, rg_entry, **kwargs):
  """The generator's score_answer (1.0 right, 0.0 wrong; partial credit where it gives it)."""
  import reasoning_gym  # in the worker process
  del prompts, kwargs
  return [float(reasoning_gym.get_score_answer_fn(name)(completion.strip(), json.loads(entry)))
          for completion, name, entry in zip(completions, rg_dataset, rg_entry)]
