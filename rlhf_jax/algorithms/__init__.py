"""rlhf_jax.algorithms: the rollout batch and the PPO family as configuration of kernels
(advantages, actor and critic losses)."""
