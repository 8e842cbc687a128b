"""rlhf_jax.rewards: the `Scorer` seam and its implementations (the rule-based verifier
router today; reward models and judges plug in the same way)."""

from rlhf_jax.rewards.router import RewardRouter
from rlhf_jax.rewards.scorer import Scorer
from rlhf_jax.rewards.scorer import Scores

__all__ = ["RewardRouter", "Scorer", "Scores"]
