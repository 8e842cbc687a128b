"""rlhf_jax.tasks: built-in tasks (problem generators with rule-based verifiers)."""
