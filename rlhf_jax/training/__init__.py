"""rlhf_jax.training: the RL loop (trainer), SFT warm start, evaluation, configs and
checkpoints; it wires sampling, rewards, algorithms and models together."""
