"""Pairwise-PPO (Pairwise-RL, arXiv:2504.04950; docs/formulas.md#pairwise-rl): PPO whose
reward is the win probability of each response against an anchor, from a pairwise generative
judge asked in both orders.

  python launch/train_judge.py --kind=pairwise --policy=runs/pw/sft --output=runs/pw/judge
  python launch/train.py --config=configs/pairwise_ppo.py:arith --workdir=runs/pw \
      --config.reward.pairwise.checkpoint=runs/pw/judge

Anchor: the example's `metadata.solution` (arith: the worked solution; use 'answer' for the
bare ground truth, or 'reference' for launch/make_references.py's responses). Reward =
P(y ≻ anchor) − 0.5 at the last token; the rest is configs/ppo.py (critic, GAE).
"""

from rlhf_jax.training.config import sibling_preset
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """Pairwise-PPO on the `arith` task or an `hf` checkpoint."""
  c = sibling_preset(__file__, "ppo", base)
  c.algorithm.name = "pairwise_ppo"
  c.reward.route = "pairwise"
  c.reward.pairwise.anchor_key = "solution"  # The ground-truth anchor (Pairwise-RL [S]).
  c.reward.pairwise.centre = 0.5  # A tie with the anchor is worth 0.
  return c
