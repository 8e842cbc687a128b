"""rlhf_jax.training: the RL loop and what only the loop uses. The loop (loop.py) runs a
Rollout and a Learner built from a validated config (config.py, build.py); stages.py
runs what must exist first (SFT warm start, offline labelling); metrics, checkpoints
and held-out evaluation."""
