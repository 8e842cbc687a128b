"""T-PPO (arXiv:2506.15050): windowed generation and Extended GAE (docs/formulas.md#t-ppo).

  python launch/train.py --config=configs/tppo.py:arith --workdir=/tmp/tppo
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """T-PPO on the `arith` task or an `hf` checkpoint.

  The paper's full text is not in our index (docs/formulas.md#t-ppo): the window, batch
  and no-KL settings are from its reviews; λ_actor and the clip range are not
  stated and follow VC-PPO.
  """
  c = base_config(base)
  a = c.algorithm
  a.name = "tppo"
  a.advantage.estimator = "gae"  # Extended GAE: unfinished rows bootstrap V(s_l) := V(s_{l-1}).
  c.rollout.group_size = 4 if base == "arith" else 16  # 512 prompts × 16 samples.
  a.advantage.gamma = 1.0
  a.advantage.actor_lam = 0.95  # Not stated; VC-PPO's λ_actor.
  a.advantage.critic_lam = 1.0  # The critic fits Monte-Carlo returns of finished responses.
  a.policy_loss.clip_low = a.policy_loss.clip_high = 0.2  # Not stated; VC-PPO's.
  a.policy_loss.agg = "token-mean"
  a.kl.placement = "none"  # No KL.
  a.value.clip = 0.5
  c.rollout.mode = "windows"
  # W: new tokens per response per step. Paper: an 8K window of a 24K cap (one third).
  c.rollout.windows.window_tokens = 32 if base == "arith" else 512
  c.reward.correct_score, c.reward.wrong_score = 1.0, -1.0
  if base == "arith":
    # Three windows of 32 per response; a continued response is re-sent as prompt +
    # tokens so far: up to 64 + 64.
    c.rollout.max_new_tokens = 96
    c.sampler.cache_length = 64 + 96
    c.sampler.prompt_buckets = (64, 128)
  else:
    c.rollout.max_new_tokens = 1536
    c.sampler.cache_length = 512 + 1536
    c.sampler.prompt_buckets = (512, 1024, 1536)
    c.optimizer.learning_rate = 1e-6
    c.optimizer.critic_learning_rate = 2e-6
  return c
