"""rlhf_jax.training: the RL loop (loop.py) over roles (roles.py) and a learner
(learner.py), built from a validated config (config.py, build.py); checkpoints,
metrics, SFT warm start and evaluation."""
