"""rlhf_jax.envs: environments for multi-turn rollouts (`rollout.mode='multi_turn'`).

base.py holds the seam (`Environment`, `StepResult`, `load_factory`); runner.py runs
environments in killable worker processes with a per-call timeout, cutting observations to
the row's budget; a worker's memory and the processes it starts are bounded (sandbox/worker_groups.py);
observations.py escapes control text in tool turns and reports failures by kind.
"""

from rlhf_jax.envs.base import Environment
from rlhf_jax.envs.base import StepResult
from rlhf_jax.envs.base import load_factory
from rlhf_jax.envs.runner import EnvironmentRunner
from rlhf_jax.envs.runner import Outcome

__all__ = ["Environment", "EnvironmentRunner", "Outcome", "StepResult", "load_factory"]
