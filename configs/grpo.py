"""GRPO (DeepSeekMath, arXiv:2402.03300): group-normalised outcome advantages, no critic.

  python launch/train.py --config=configs/grpo.py:arith --workdir=/tmp/grpo
  python launch/train.py --config=configs/grpo.py:hf --config.model.checkpoint=DIR \
      --config.data.train_file=prompts.jsonl --workdir=DIR

The paper's KL loss (β = 0.04, k3) is on; Dr. GRPO (arXiv:2503.20783) is
`--config.algorithm.estimator=dr_grpo --config.algorithm.agg=seq-mean-token-sum-norm`,
RLOO `estimator=rloo`, REINFORCE++ `estimator=reinforce_pp_baseline`.
"""

from rlhf_jax.training.config import base_config


def get_config(variant: str = "arith"):
  """GRPO on the `arith` task or an `hf` checkpoint."""
  c = base_config(variant)
  a = c.algorithm
  a.name = "grpo"
  a.estimator = "grpo"  # A_i = (R_i − mean_G R) / (std_G R + ε) (§4.1.2).
  a.group_size = 8  # G (paper: 64; TRL default 8).
  a.clip_low = a.clip_high = 0.2  # Symmetric PPO clip (community default; paper silent).
  a.agg = "seq-mean-token-mean"  # (1/G) Σ_i (1/|o_i|) Σ_t (Eq. 3).
  a.kl_loss_coef = 0.04  # β (paper 0.04) with the k3 estimator.
  a.kl_estimator = "k3"
  return c
