"""GRPO on the built-in `pycalc` task: answers are Python programs run in the sandbox.

  python launch/train.py --config=configs/pycalc.py --workdir=/tmp/pycalc

The policy (arith's tiny model, warm-started on `x=<a><op><b>` programs) writes a
program for each word problem; the code verifier runs every sample in its own sandbox
(rewards/code.py; 32 prompts × 8 samples = 256 programs per step) and rewards the ones
whose `x` is right. Per-task reward metrics (accuracy, failure rate, sandbox seconds)
are logged as reward/pycalc/*.
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """GRPO (as configs/grpo.py) on pycalc (the :arith preset only: the task is generated)."""
  c = base_config(base)
  a = c.algorithm
  a.name = "grpo"
  a.advantage.estimator = "grpo"
  c.rollout.group_size = 8
  a.policy_loss.clip_low = a.policy_loss.clip_high = 0.2
  a.policy_loss.agg = "seq-mean-token-mean"
  a.kl.placement = "loss"
  a.kl.coef = 0.04
  a.kl.estimator = "k3"
  c.data.task = "pycalc"
  c.data.levels = (1, 2, 3)
  c.data.level_weights = (1.0, 1.0, 1.0)
  c.sft.steps = 80  # a short warm start (~52 % greedy): its errors are miscopied digits
  c.sft.levels = (1, 2, 3)
  c.sft.level_weights = (1.0, 1.0, 1.0)
  c.optimizer.learning_rate = 1e-4
  c.rollout.prompts_per_step = 32
  c.rollout.max_new_tokens = 24  # "x=1234*7" and an end token fit easily
  c.sampler.cache_length = c.data.prompt_length + c.rollout.max_new_tokens
  c.train.steps = 30
  c.train.eval_every = 10
  c.reward.sandbox.timeout_s = 5.0
  return c
