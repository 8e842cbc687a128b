"""The learner registry: `algorithm.learner` → a factory `(config, model, params, mesh)
→ Learner`. A new family registers its learner here (or with `register_learner`)."""

from __future__ import annotations

from typing import Callable

from rlhf_jax.algorithms.dpo_learner import DPOLearner
from rlhf_jax.algorithms.dqo_learner import DQOLearner
from rlhf_jax.algorithms.learner import Learner
from rlhf_jax.algorithms.ppo_learner import PPOLearner

LearnerFactory = Callable[..., Learner]

LEARNERS: dict[str, LearnerFactory] = {
    "ppo": PPOLearner.from_config,
    "dpo": DPOLearner.from_config,
    "dqo": DQOLearner.from_config,
}


def register_learner(name: str, factory: LearnerFactory) -> None:
  """Makes `algorithm.learner = name` build its learner with `factory(c, model, params,
  mesh)`."""
  if name in LEARNERS:
    raise ValueError(f"learner {name!r} is already registered")
  LEARNERS[name] = factory


def build_learner(c, model, params, mesh) -> Learner:
  """The learner of `algorithm.learner` for the policy (`model`, `params` on `mesh`)."""
  return LEARNERS[c.algorithm.learner](c, model, params, mesh)
