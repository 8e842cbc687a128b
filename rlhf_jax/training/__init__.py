"""rlhf_jax.training: the RL loop and what only the loop uses. `run(config, workdir)`
(stages.py) is the one entry point: it validates, joins the job, runs the stages that must
exist first (SFT warm start, offline labelling) and the loop (loop.py), which runs a Rollout
and a Learner built from a validated config (config.py, build.py); metrics, checkpoints
and held-out evaluation."""

from rlhf_jax.training.stages import run

__all__ = ["run"]
