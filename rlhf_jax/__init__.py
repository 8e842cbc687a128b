"""rlhf_jax: reinforcement learning of language models in JAX (PPO family for reasoning)."""

__version__ = "0.1.0"
