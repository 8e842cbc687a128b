"""VC-PPO (arXiv:2503.01491): value pretraining and decoupled GAE
(docs/formulas.md#vc-ppo).

  python launch/train.py --config=configs/vcppo.py:arith --workdir=/tmp/vcppo
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """VC-PPO on the `arith` task or an `hf` checkpoint."""
  c = base_config(base)
  a = c.algorithm
  a.name = "vcppo"
  a.advantage.estimator = "gae"
  c.rollout.group_size = 4  # Samples per prompt (batch size; no group baseline).
  a.advantage.gamma = 1.0
  a.advantage.actor_lam = 0.95  # λ_actor (§4: [0.95, 1) works, 1.0 is worst).
  a.advantage.critic_lam = 1.0  # λ_critic = 1: Monte-Carlo value targets (§4).
  # Policy frozen while the critic fits λ=1 targets (paper: until the value loss
  # plateaus; count unspecified — VAPO uses 50).
  a.value.pretrain_steps = 5 if base == "arith" else 50
  a.policy_loss.clip_low = a.policy_loss.clip_high = 0.2
  a.policy_loss.agg = "token-mean"
  a.value.clip = 0.5
  c.reward.correct_score, c.reward.wrong_score = 1.0, -1.0  # Verifier ±1 (§5).
  if base == "hf":
    c.optimizer.learning_rate = 1e-6
    c.optimizer.critic_learning_rate = 2e-6
  return c
