"""Iterative (online) DPO: pairs from our own samples ranked by the scorer (Xu et al.,
arXiv:2404.10719 §12 compare it with PPO), the reference refreshed every few steps.

  python launch/train.py --config=configs/iterative_dpo.py:arith --workdir=/tmp/idpo

Each step samples G responses per prompt, scores them (the `reward` section: the
verifier by default) and trains DPO on the best against the worst of each group;
groups whose scores tie give no pair. Every `algorithm.dpo.reference_sync_every` steps
π_ref ← π_θ (one DPO round per refresh).
"""

from rlhf_jax.training.config import sibling_preset
from rlhf_jax.training.overlays import with_overlays


@with_overlays
def get_config(base: str = "arith"):
  """Online DPO on the `arith` task or an `hf` checkpoint."""
  c = sibling_preset(__file__, "dpo", base)
  c.algorithm.name = "iterative_dpo"
  c.algorithm.dpo.reference = "online"  # The samples are new each step.
  c.algorithm.dpo.reference_sync_every = 10  # Steps per DPO round.
  c.rollout.mode = "groups"
  c.rollout.group_size = 4  # G (the arith PPO preset's batch: 16 prompts × 4).
  c.rollout.prompts_per_step = 16 if base == "arith" else 128
  c.reward.wrong_score = 0.0  # 1/0: a group with both a right and a wrong sample makes a pair.
  if base == "arith":
    # Pairs of the current policy's samples stay on its support: the rate that makes
    # offline DPO collapse is stable here (docs/offline_methods.md).
    c.optimizer.learning_rate = 1e-4
  return c
