"""The one optimizer factory: global-norm clipping, then AdamW on an optax schedule.

Every trained model uses it: the RL roles (actor, critic), SFT, reward models, judges,
PRMs and the Q♯ guide. Two schedules cover them:

  `rl_schedule`   linear warmup that already moves on the first update, then a constant
                  rate (DAPO §4.1) or a cosine decay to a fraction of it;
  `fit_schedule`  warmup from zero, then a cosine decay over the run (supervised fits).
"""

from __future__ import annotations

import ml_collections
import optax

from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import one_of
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section

SCHEDULES = ("constant", "cosine")  # optimizer.schedule: `rl_schedule` without / with decay


def rl_schedule(learning_rate: float, warmup_steps: int, *, decay_updates: int = 0,
                final_fraction: float = 0.1) -> optax.Schedule:
  """count → rate: lr·min(1, (k+1)/warmup) for update k (the first update already moves),
  then constant, or, with `decay_updates` > 0, a cosine from lr after warmup down to
  `final_fraction`·lr at update `decay_updates` (and after it)."""
  warmup = max(warmup_steps, 1)
  # Update k = warmup − 1 is the last warmup update and the first of the decay.
  ramp = optax.linear_schedule(learning_rate / warmup, learning_rate, warmup - 1)
  if decay_updates <= 0:
    after = optax.constant_schedule(learning_rate)
  else:
    after = optax.cosine_decay_schedule(learning_rate, max(decay_updates - warmup, 1),
                                        alpha=final_fraction)
  return optax.join_schedules([ramp, after], [warmup - 1])


def fit_schedule(learning_rate: float, warmup_steps: int, steps: int, *,
                 final_fraction: float = 0.1) -> optax.Schedule:
  """count → rate for a supervised fit of `steps` updates: linear warmup from 0 over
  `warmup_steps`, then a cosine decay to `final_fraction`·lr at the last step."""
  return optax.warmup_cosine_decay_schedule(
      0.0, learning_rate, max(warmup_steps, 1), max(steps, warmup_steps + 1),
      end_value=learning_rate * final_fraction)


def make_optimizer(schedule: optax.ScalarOrSchedule, *, weight_decay: float = 0.0,
                   max_grad_norm: float | None = 1.0) -> optax.GradientTransformation:
  """Global-norm clipping at `max_grad_norm` (None: off), then AdamW (β = 0.9, 0.999,
  ε = 1e-8) with decoupled `weight_decay` on `schedule` (a rate or an optax schedule)."""
  adamw = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=weight_decay)
  if max_grad_norm is None:
    return adamw
  return optax.chain(optax.clip_by_global_norm(max_grad_norm), adamw)


def optimizer_config() -> ml_collections.ConfigDict:
  """The `optimizer` section of the RL roles (actor, critic) with its defaults (one
  comment per field)."""
  o = ml_collections.ConfigDict()
  o.learning_rate = 1e-6  # Actor peak learning rate.
  o.warmup_steps = 20  # Linear warmup in updates (DAPO: 20), then:
  # 'constant' (DAPO §4.1) or 'cosine' (down to final_fraction × the rate at the end).
  o.schedule = "constant"
  o.final_fraction = 0.1
  o.weight_decay = 0.0  # AdamW weight decay (DAPO script: 0.1).
  o.max_grad_norm = 1.0  # Global-norm gradient clipping.
  o.critic_learning_rate = 1e-5  # Critic peak learning rate.
  return o


def validate_optimizer(o) -> None:
  """`optimizer.*`: rates, schedule, decay and clipping."""
  for field in ("learning_rate", "critic_learning_rate", "max_grad_norm"):
    check_range(f"optimizer.{field}", o[field], low=0, low_open=True)
  check_range("optimizer.warmup_steps", o.warmup_steps, low=0)
  check_range("optimizer.weight_decay", o.weight_decay, low=0)
  one_of("optimizer.schedule", o.schedule, SCHEDULES)
  check_range("optimizer.final_fraction", o.final_fraction, low=0, high=1)


def check_optimizer_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The trainer's `optimizer` section."""
  del checking
  validate_optimizer(c.optimizer)


SECTION = Section("optimizer", at="optimizer", fields=optimizer_config,
                  check=check_optimizer_section)
