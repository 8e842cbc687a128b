"""GRPO (DeepSeekMath, arXiv:2402.03300): group-normalised outcome advantages, no critic.

  python launch/train.py --config=configs/grpo.py:arith --workdir=/tmp/grpo
  python launch/train.py --config=configs/grpo.py:hf --config.model.checkpoint=DIR \
      --config.data.train_file=prompts.jsonl --workdir=DIR
  (configs/grpo.py:hf,cpu: the same, shrunk to two CPU cores by training/overlays.py)

The paper's KL loss (β = 0.04, k3) is on; Dr. GRPO (arXiv:2503.20783) is
`--config.algorithm.advantage.estimator=dr_grpo
 --config.algorithm.policy_loss.agg=seq-mean-token-sum-norm`, RLOO `estimator=rloo`,
REINFORCE++ `estimator=reinforce_pp_baseline`.
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """GRPO on the `arith` task or an `hf` checkpoint."""
  c = base_config(base)
  a = c.algorithm
  a.name = "grpo"
  a.advantage.estimator = "grpo"  # A_i = (R_i − mean_G R) / (std_G R + ε) (§4.1.2).
  c.rollout.group_size = 8  # G (paper: 64; TRL default 8).
  a.policy_loss.clip_low = a.policy_loss.clip_high = 0.2  # Symmetric clip (paper silent).
  a.policy_loss.agg = "seq-mean-token-mean"  # (1/G) Σ_i (1/|o_i|) Σ_t (Eq. 3).
  a.kl.placement = "loss"  # −β·KL in the objective, not in the reward (Eq. 3).
  a.kl.coef = 0.04  # β (paper 0.04) ...
  a.kl.estimator = "k3"  # ... with the unbiased, non-negative k3 estimator (Eq. 4).
  return c
