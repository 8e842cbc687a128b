"""The one supervised loop: SFT, reward models, PRMs, judges and the Q♯ guide fit with it."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import optax

from rlhf_jax.optim.optimizer import fit_schedule
from rlhf_jax.optim.optimizer import make_optimizer


@dataclasses.dataclass
class FitResult:
  """What `fit` returns: final params and the loss curve."""
  params: Any
  losses: list[float]
  seconds: float


def fit(loss_fn: Callable, params, make_batch: Callable[[int], object], *, steps: int,
        learning_rate: float, warmup_steps: int = 20, weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        optimizer: optax.GradientTransformation | None = None,
        progress: Callable[[int, float], None] | None = None) -> FitResult:
  """Minimises `loss_fn(params, batch)` for `steps` steps on `make_batch(step)` batches
  (any pytree of arrays).

  The optimizer is `make_optimizer` on `fit_schedule` (AdamW, warmup from 0 and a
  cosine decay to 10 %) unless `optimizer` is given. `progress(step, loss)` is called
  after every step (it reads the loss: one host sync per step).
  """
  if optimizer is None:
    optimizer = make_optimizer(fit_schedule(learning_rate, warmup_steps, steps),
                               weight_decay=weight_decay, max_grad_norm=max_grad_norm)

  @jax.jit
  def step_fn(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = jax.jit(optimizer.init)(params)  # one program, not one per moment's shape
  losses = []
  start = time.perf_counter()
  for step in range(steps):
    batch = jax.tree.map(jax.numpy.asarray, make_batch(step))
    params, opt_state, loss = step_fn(params, opt_state, batch)
    losses.append(float(loss))
    if progress is not None:
      progress(step, losses[-1])
  return FitResult(params=params, losses=losses, seconds=time.perf_counter() - start)
