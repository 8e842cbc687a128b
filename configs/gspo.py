"""GSPO (Zheng et al., arXiv:2507.18071): GRPO's advantages, PPO's clip on a
length-normalised sequence-level ratio (docs/formulas.md#gspo).

  python launch/train.py --config=configs/gspo.py:arith --workdir=/tmp/gspo
  python launch/train.py --config=configs/gspo.py:hf --config.model.checkpoint=DIR \
      --config.data.train_file=prompts.jsonl --workdir=DIR

GSPO-token (per-token advantages, e.g. with a critic) is
`--config.algorithm.policy_loss.kind=gspo_token`; with GRPO's advantages it gives the
same loss and gradient as `gspo`.
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """GSPO on the `arith` task or an `hf` checkpoint (paper values, docs/formulas.md#gspo)."""
  c = base_config(base)
  a = c.algorithm
  a.name = "gspo"
  a.advantage.estimator = "grpo"  # Group-normalised A_i, one per response (GRPO's).
  c.rollout.group_size = 8  # G (the paper's is not quoted; GRPO preset's).
  a.policy_loss.kind = "gspo"  # s_i = exp(mean_t log π/π_old), clipped per sequence.
  # Tiny ranges: s_i is a geometric mean over the response (paper v2 §5.1).
  a.policy_loss.clip_low = 3e-4  # ε_low.
  a.policy_loss.clip_high = 4e-4  # ε_high.
  a.policy_loss.agg = "seq-mean-token-mean"  # (1/G) Σ_i ℓ_i: each sequence counts once.
  a.kl.placement = "none"  # KL coefficient 0: no KL term, no reference model.
  a.kl.coef = 0.0
  # The rollout batch split into 4 mini-batches: later ones are off-policy, which the
  # sequence clip bounds.
  c.train.minibatches = 4
  return c
