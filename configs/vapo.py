"""VAPO (arXiv:2504.05118): VC-PPO + length-adaptive GAE, clip-higher, token-level loss,
positive-example NLL and group sampling: VAPO's seven changes, numbered below as in
docs/formulas.md#vapo.

  python launch/train.py --config=configs/vapo.py:arith --workdir=/tmp/vapo
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """VAPO on the `arith` task or an `hf` checkpoint."""
  c = base_config(base)
  a = c.algorithm
  a.name = "vapo"
  a.advantage.estimator = "gae"
  c.rollout.group_size = 8 if base == "arith" else 16  # Group sampling: 512 × 16 (change 7).
  a.advantage.gamma = 1.0
  a.advantage.critic_lam = 1.0  # Decoupled GAE: λ_critic = 1 (change 2).
  # Length-adaptive λ_actor = 1 − 1/(α·l), α = 0.05 (change 3). Arith responses are ~40
  # tokens (λ ≈ 0.5); the paper's responses are thousands.
  a.advantage.lam_schedule = "length_adaptive"
  a.advantage.length_adaptive_alpha = 0.05
  a.value.pretrain_steps = 5 if base == "arith" else 50  # Value warm-up: 50 steps (change 1).
  a.policy_loss.clip_low, a.policy_loss.clip_high = 0.2, 0.28  # Clip-higher (change 4).
  a.policy_loss.agg = "token-mean"  # Token-level loss (change 5).
  a.policy_loss.positive_nll_coef = 0.1  # μ of the NLL on correct samples (change 6).
  a.value.clip = 0.5  # Not stated in the paper; verl's default.
  c.reward.correct_score, c.reward.wrong_score = 1.0, -1.0
  if base == "hf":
    c.optimizer.learning_rate = 1e-6  # Actor lr (paper §5.1).
    c.optimizer.critic_learning_rate = 2e-6  # Critic lr (paper §5.1).
  return c
