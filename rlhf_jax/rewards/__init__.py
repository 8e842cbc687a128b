"""rlhf_jax.rewards: the `Scorer` seam and its implementations: rule verifiers and the code
sandbox (router.py), the Bradley–Terry reward model (reward_model.py), generative judges
(genrm.py, pairwise.py over judge.py), the process reward model (prm.py), and routing
between them (hybrid.py; its config in config.py)."""

from rlhf_jax.rewards.scorer import Scorer
from rlhf_jax.rewards.scorer import Scores

__all__ = ["RewardRouter", "Scorer", "Scores"]


def __getattr__(name: str):
  """`RewardRouter`, imported on first use: the router brings the tasks and JAX, which a
  reward worker process (it imports rewards/functions.py) would load for nothing, at each
  start and in its memory bound."""
  if name == "RewardRouter":
    from rlhf_jax.rewards.router import RewardRouter  # pylint: disable=import-outside-toplevel
    return RewardRouter
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
