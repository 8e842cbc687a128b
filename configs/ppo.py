"""PPO with a critic and GAE (Ouyang et al. / verl defaults; ALGORITHMS.md §1.1).

  python launch/train.py --config=configs/ppo.py:arith --workdir=/tmp/ppo
"""

from rlhf_jax.training.config import base_config


def get_config(variant: str = "arith"):
  """PPO on the `arith` task or an `hf` checkpoint."""
  c = base_config(variant)
  a = c.algorithm
  a.name = "ppo"
  a.estimator = "gae"  # GAE advantages from a value model.
  a.group_size = 4  # Samples per prompt (PPO needs no groups; this sets the batch).
  a.gamma = 1.0  # γ (verl default).
  a.actor_lam = a.critic_lam = 0.95  # One λ for both (tunix 0.95; verl 1.0).
  a.whiten_advantages = True  # Batch-whitened advantages (verl, OpenRLHF).
  a.clip_low = a.clip_high = 0.2  # ε.
  a.dual_clip = 3.0  # verl's clip_ratio_c.
  a.agg = "token-mean"  # verl default loss_agg_mode.
  a.kl_reward_coef = 0.01  # β of the KL in the reward (OpenRLHF init_coef 0.01).
  a.kl_estimator = "k1"  # verl's default for the in-reward KL.
  a.kl_target = 0.1  # Adaptive controller: target KL (verl / OpenRLHF 0.1)...
  a.kl_horizon = 10000.0  # ... over a horizon of 10000 samples.
  a.value_clip = 0.5  # verl cliprange_value.
  c.reward.wrong_score = 0.0  # Binary 1/0 reward.
  if variant == "hf":
    c.optimizer.learning_rate = 1e-6  # verl actor lr.
    c.optimizer.critic_learning_rate = 1e-5  # verl critic lr.
    c.optimizer.weight_decay = 0.01
  return c
