"""PPO with a critic and GAE (Ouyang et al. / verl defaults; docs/formulas.md#ppo).

  python launch/train.py --config=configs/ppo.py:arith --workdir=/tmp/ppo
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """PPO on the `arith` task or an `hf` checkpoint."""
  c = base_config(base)
  a = c.algorithm
  a.name = "ppo"
  a.advantage.estimator = "gae"  # GAE advantages from a value model.
  c.rollout.group_size = 4  # Samples per prompt (PPO needs no groups; this sets the batch).
  a.advantage.gamma = 1.0  # γ (verl default).
  a.advantage.actor_lam = a.advantage.critic_lam = 0.95  # One λ for both (tunix 0.95; verl 1.0).
  a.advantage.whiten = True  # Batch-whitened advantages (verl, OpenRLHF).
  a.policy_loss.clip_low = a.policy_loss.clip_high = 0.2  # ε.
  a.policy_loss.dual_clip = 3.0  # verl's clip_ratio_c.
  a.policy_loss.agg = "token-mean"  # verl default loss_agg_mode.
  a.kl.placement = "reward"  # −β·KL per token in the reward (InstructGPT).
  a.kl.coef = 0.01  # Initial β (OpenRLHF init_coef 0.01).
  a.kl.estimator = "k1"  # verl's default for the in-reward KL.
  a.kl.controller = "adaptive"  # Ziegler et al.: β follows a target KL...
  a.kl.target = 0.1  # ... of 0.1 (verl / OpenRLHF) ...
  a.kl.horizon = 10000.0  # ... over a horizon of 10000 samples.
  a.value.clip = 0.5  # verl cliprange_value.
  c.reward.wrong_score = 0.0  # Binary 1/0 reward.
  if base == "hf":
    c.optimizer.learning_rate = 1e-6  # verl actor lr.
    c.optimizer.critic_learning_rate = 1e-5  # verl critic lr.
    c.optimizer.weight_decay = 0.01
  return c
