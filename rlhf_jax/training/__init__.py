"""rlhf_jax.training: the RL loop and what only the loop uses. `run(config, workdir)`
(stages.py) is the one entry point: it validates, joins the job, runs the stages that must
exist first (SFT warm start, offline labelling) and the loop (loop.py), which runs a Rollout
and a Learner built from a validated config (config.py, build.py); metrics, loggers,
checkpoints and held-out evaluation; the workdir's lock and stop signals (run_control.py);
and the reward-model fits that run before it (reward_fits.py: launch/train_rm.py and its
peers)."""

from rlhf_jax.training.stages import run

__all__ = ["run"]
