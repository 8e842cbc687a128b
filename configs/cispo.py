"""CISPO (MiniMax-M1, arXiv:2506.13585 §3.1 Eq. 4): REINFORCE on GRPO's advantages,
weighted by a clipped, stop-gradient importance ratio; token-mean like DAPO
(docs/formulas.md#cispo).

  python launch/train.py --config=configs/cispo.py:arith --workdir=/tmp/cispo
  python launch/train.py --config=configs/cispo.py:hf --config.model.checkpoint=DIR \
      --config.data.train_file=prompts.jsonl --workdir=DIR

DAPO's dynamic sampling is `--config.rollout.mode=dynamic`.
"""

from rlhf_jax.training.config import base_config
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """CISPO on the `arith` task or an `hf` checkpoint."""
  c = base_config(base)
  a = c.algorithm
  a.name = "cispo"
  a.advantage.estimator = "grpo"  # Group-normalised advantages (Â in Eq. 4).
  c.rollout.group_size = 8 if base == "arith" else 16  # G (DAPO preset's).
  a.policy_loss.kind = "cispo"  # −sg(clip(r, 1 − ε_low, 1 + ε_high))·A·log π, no min().
  # No lower bound on the IS weight (§3.1: ε_low^IS "large"); r > 0, so 1 removes it.
  a.policy_loss.clip_low = 1.0
  # ε_high^IS: the paper tunes it without quoting a value; a weight cap of 5 (ScaleRL's
  # ε_max, arXiv:2510.13786, TRL's recommended `epsilon_high` for loss_type='cispo').
  a.policy_loss.clip_high = 4.0
  a.policy_loss.agg = "token-mean"  # 1 / Σ_i |o_i| over the whole batch (Eq. 4).
  a.kl.placement = "none"  # No KL term, no reference model.
  a.kl.coef = 0.0
  return c
