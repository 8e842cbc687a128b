"""Optimisation: roles (trained and frozen models), the one optimizer factory and the one
supervised fit."""

from rlhf_jax.optim.fit import FitResult
from rlhf_jax.optim.fit import fit
from rlhf_jax.optim.optimizer import fit_schedule
from rlhf_jax.optim.optimizer import make_optimizer
from rlhf_jax.optim.optimizer import rl_schedule
from rlhf_jax.optim.roles import FrozenRole
from rlhf_jax.optim.roles import TrainState
from rlhf_jax.optim.roles import TrainedRole

__all__ = ["FitResult", "FrozenRole", "TrainState", "TrainedRole", "fit", "fit_schedule",
           "make_optimizer", "rl_schedule"]
