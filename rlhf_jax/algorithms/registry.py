"""The learner registry: `algorithm.learner` → a `LearnerSpec`, the family's record.

A spec holds what the rest of the library may ask about a learner: its factory
`(config, model, params, mesh) → Learner`, its config sub-section of `algorithm` (built by
training/config.py's `base_config` for every learner registered before it runs, and
checked on every run), its own rules, the rollout modes it trains from, and the features
it supports. `learner_spec(c)` is THE way to ask about `c.algorithm.learner`: no other
module compares the learner's name (tests/test_layout.py). A new family registers itself
with `register_learner(LearnerSpec(...))` or `register_learner(name, factory, **features)`
(the `LEARNERS` Registry, rlhf_jax/registry.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from rlhf_jax.algorithms import distillation
from rlhf_jax.algorithms import dpo
from rlhf_jax.algorithms import dqo
from rlhf_jax.algorithms.dpo_learner import DPOLearner
from rlhf_jax.algorithms.dqo_learner import DQOLearner
from rlhf_jax.algorithms.learner import Learner
from rlhf_jax.algorithms import ppo_learner
from rlhf_jax.algorithms.ppo_learner import PPOLearner
from rlhf_jax.registry import Registry

LearnerFactory = Callable[..., Learner]


@dataclasses.dataclass(frozen=True)
class LearnerSpec:
  """A learner family: how to build it, its config section and rules, what it trains from.

  `section` names its sub-section of `algorithm` (`algorithm.<section>`), made by
  `default_section()` and checked alone by `check_section(section)` on every run (even when
  another learner is picked: a typo in a section is an error before it is used).
  `validate(c, *, fixed_data)` holds its rules on the whole config when it is picked;
  `fixed_data`: the rollout mode trains on fixed data (rollout.mode 'offline').
  Each raises ConfigError naming the field (`algorithm.<section>.<field>`).
  """
  name: str
  factory: LearnerFactory  # (c, model, params, mesh) -> Learner
  section: str | None = None
  default_section: Callable[[], ml_collections.ConfigDict] | None = None
  check_section: Callable[[ml_collections.ConfigDict], None] | None = None
  validate: Callable[..., None] | None = None  # validate(c, *, fixed_data: bool)
  rollout_modes: tuple[str, ...] = ("groups", "dynamic")  # the rollout modes it trains from
  pairs: bool = False  # offline data as chosen/rejected pairs (a group's best and worst)
  packing: bool = False  # packed forwards (train.packing)
  lora: bool = False  # LoRA adapters (model.lora_rank > 0)
  staleness: bool = False  # off-policy samples (rollout.max_staleness > 0): corrects them
  value_pretraining: bool = False  # algorithm.value.pretrain_steps > 0
  # The reference's log-probs from the sampling servers (rollout.reference_logprobs
  # 'sampler'): the learner reads a reference through the PPO family's KL.
  sampler_reference: bool = False

  def __post_init__(self):
    if (self.section is None) != (self.default_section is None):
      raise ValueError(f"learner {self.name!r}: section and default_section go together")


# The table of `algorithm.learner` (a name, or "package.module:NAME" of a LearnerSpec).
LEARNERS: Registry[LearnerSpec] = Registry("learner", "algorithm.learner", LearnerSpec,
                                           what="LearnerSpec")


def register_learner(spec_or_name: LearnerSpec | str, factory: LearnerFactory | None = None,
                     **features) -> LearnerSpec:
  """Makes `algorithm.learner = name` build its learner: `register_learner(spec)`, or
  `register_learner(name, factory, **LearnerSpec fields)`; `LEARNERS.register`. Register
  before `base_config()` runs for its `algorithm.<section>` to be in the config. As for
  every registry, registering a name again replaces it (re-running a notebook cell); the
  built-in families cannot be replaced, and a section belongs to one learner."""
  if isinstance(spec_or_name, LearnerSpec):
    if factory is not None or features:
      raise TypeError("register_learner(spec) takes no factory or features")
    spec = spec_or_name
  else:
    if factory is None:
      raise TypeError(f"register_learner({spec_or_name!r}) needs a factory")
    spec = LearnerSpec(name=spec_or_name, factory=factory, **features)
  if spec.section is not None and any(s.section == spec.section and s.name != spec.name
                                      for s in LEARNERS.values()):
    raise ValueError(f"learner {spec.name!r}: section algorithm.{spec.section} is taken")
  return LEARNERS.register(spec.name, spec)


def learner_spec(c_or_name) -> LearnerSpec:
  """The spec of `c.algorithm.learner` (a config) or of a learner's name; ConfigError
  naming `algorithm.learner` when it is neither registered nor a module's LearnerSpec
  (`LEARNERS.resolve`)."""
  name = c_or_name if isinstance(c_or_name, str) else c_or_name.algorithm.learner
  return LEARNERS.resolve(name)


def build_learner(c, model, params, mesh) -> Learner:
  """The learner of `algorithm.learner` for the policy (`model`, `params` on `mesh`)."""
  return learner_spec(c).factory(c, model, params, mesh)


for _spec in (
    LearnerSpec(
        name="ppo", factory=PPOLearner.from_config,
        # algorithm.distill: the teacher its reference role may be loaded from
        # (distillation.py)
        section=distillation.SECTION, default_section=distillation.distill_config,
        check_section=distillation.check_distill_fields, validate=ppo_learner.validate_run,
        rollout_modes=("groups", "dynamic", "windows", "multi_turn"),
        packing=True, lora=True, staleness=True, value_pretraining=True,
        sampler_reference=True),
    LearnerSpec(
        name="dpo", factory=DPOLearner.from_config, section="dpo",
        default_section=dpo.dpo_config, check_section=dpo.validate_dpo_fields,
        validate=dpo.validate_run, rollout_modes=("groups", "dynamic", "offline"),
        pairs=True),
    LearnerSpec(
        name="dqo", factory=DQOLearner.from_config, section="dqo",
        default_section=dqo.dqo_config, check_section=dqo.validate_dqo_fields,
        validate=dqo.validate_run, rollout_modes=("groups", "dynamic", "offline")),
):
  LEARNERS.register(_spec.name, _spec, built_in=True)
BUILT_IN = LEARNERS.built_ins()
