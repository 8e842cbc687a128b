"""rlhf_jax.rewards: rule-based verifiers and a router that scores samples by task,
with a per-sample timeout and failure reason."""

from rlhf_jax.rewards.router import RewardRouter
from rlhf_jax.rewards.router import ScoredBatch

__all__ = ["RewardRouter", "ScoredBatch"]
