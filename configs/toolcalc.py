"""GRPO on the built-in `toolcalc` task: multi-turn episodes with a calculator tool.

  python launch/train.py --config=configs/toolcalc.py --workdir=/tmp/toolcalc

The problems are products of a 3–4 digit and a 2 digit number (4–6 digit products,
tasks/toolcalc.py), which arith's tiny model cannot work out in its head. The warm start imitates two teachers: half
the demonstrations answer directly (right, but in a form the student cannot imitate), half
call the calculator (`<tool_call>{...}</tool_call>`, the tool turn, then "Answer: N").
RL (GRPO over whole episodes, rollout.mode 'multi_turn') learns to call the tool, and to
copy its operands and result exactly; held-out accuracy is that of greedy episodes with
the calculator (docs/agents.md has the figures and the command).
"""

from rlhf_jax.training.config import sibling_preset
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """configs/grpo.py on toolcalc (the :arith preset only: the task is generated)."""
  c = sibling_preset(__file__, "grpo", base)
  c.data.task = "toolcalc"
  c.data.levels = c.sft.levels = (1, 2)  # a of 3 or 4 digits, b of 2: 4–6 digit products
  c.data.level_weights = c.sft.level_weights = (1.0, 1.0)
  c.data.num_eval = 128
  c.sft.steps = 1000  # the student learns to copy digits (the loss drops) after ~300-600
  c.sft.direct_fraction = 0.5  # the other half call the calculator
  c.optimizer.learning_rate = 1e-4
  c.rollout.mode = "multi_turn"
  c.env.factory = "rlhf_jax.envs.tools:calculator_environment"
  c.env.turn_end = "<|im_end|>"
  c.env.max_turns = 2  # the call, then the answer
  c.env.max_tokens = 160  # a call (~80 tokens), the tool turn (~35) and the answer
  c.rollout.max_new_tokens = 96  # one model turn
  c.sampler.cache_length = c.data.prompt_length + c.env.max_tokens
  # A slot per episode of a step (16 × 8): one decode batch, and every first turn's cache
  # row is kept for its continuation (sampler.parked_rows defaults to num_slots).
  c.sampler.num_slots = c.rollout.prompts_per_step * c.rollout.group_size
  # Whole prompts, and continuations (the conversation so far) up to the cache's length.
  c.sampler.prompt_buckets = (c.data.prompt_length, c.sampler.cache_length - 1)
  c.train.steps = 20
  c.train.eval_every = 5
  c.train.eval_samples = 0  # greedy episodes only (sampled ones cost 4× the time)
  return c
