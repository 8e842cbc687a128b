"""Roles: the models a run holds. A trained role owns its parameters, optimizer state,
layout and one jitted, donated update over a whole rollout batch; a frozen role
holds parameters that only a rule changes (the reference's EMA).

The update of a trained role is one program per run:

    for epoch in E:                       lax.scan
      permute the rows (device RNG)
      for mini-batch in M:                lax.scan
        grads = Σ_micro ∇ loss(micro, N)  lax.scan; N = the mini-batch's global count
        state ← optimizer step            skipped if non-finite or nothing to learn

Summing micro-batch losses that share the mini-batch's normalizer N gives the
unsplit loss exactly (kernels' `agg_normalizer`), so gradient accumulation
changes memory, not the update. Parameters and optimizer state are donated:
the update writes them in place instead of holding two copies at the peak.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhf_jax.parallel.sharding import BATCH_AXES


@flax.struct.dataclass
class TrainState:
  """A trained model's parameters and optimizer state."""
  params: Any
  opt_state: Any


def on_mesh(tree, mesh):
  """Every leaf that is not already laid out on `mesh` (a NamedSharding), replicated on
  it. The update's outputs always carry mesh layouts; an input on a single-device
  layout (an optimizer's step count, a scalar made with jnp) would make the second
  call's arguments differ from the first's and compile the whole program again."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def place(x):
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh == mesh:
      return x
    return jax.device_put(x, replicated)

  return jax.tree.map(place, tree)


# One program for a whole tree (eagerly, every leaf's shape compiled a copy of its own).
_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


def new_train_state(optimizer: optax.GradientTransformation, params, mesh) -> TrainState:
  """Params with a fresh optimizer state on `mesh`: moments take the params' layout,
  scalars (step counts) and params not yet laid out on the mesh are replicated."""
  params = on_mesh(params, mesh)
  return TrainState(params=params, opt_state=on_mesh(optimizer.init(params), mesh))


def _where(condition, new, old):
  return jax.tree.map(lambda n, o: jnp.where(condition, n, o), new, old)


def _split_rows(tree, parts: int):
  """[N, ...] leaves → [parts, N / parts, ...]."""
  return jax.tree.map(lambda x: x.reshape(parts, x.shape[0] // parts, *x.shape[1:]), tree)


# How a micro-batch's metrics combine into its mini-batch's: the one place that decides,
# for every role. A loss term divided by the mini-batch's global count (`Normalizers`,
# `agg_normalizer`) is the micro-batch's share of the mini-batch's term: shares are
# summed (as the loss itself is), so the logged term is the unsplit loss's. A name
# ending in `_max` / `_min` is an extreme over the micro-batch: max / min. Any other
# metric is a mean over the micro-batch's own tokens or rows (entropy, clip fractions,
# KL estimates, log-prob gaps, value mean, DPO's reward margins): the mean of those
# means, exact when the micro-batches hold equal counts (verl averages its micro-batch
# metrics the same way). The critic's explained variance, a ratio of variances, is
# logged as its micro-batches' mean: an estimate, not the mini-batch's value. A name
# ending in `_loss` is read as a globally normalised term, so a policy loss from a user's
# module that logs one (`my_term_loss`) is summed with no edit here.
SUMMED_METRICS = frozenset({"pg_loss", "kl_loss", "positive_nll", "value_loss"})
SUMMED_SUFFIX = "_loss"


def combine_micro_metrics(metrics: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Metrics stacked over U micro-batches ([U] leaves) → the mini-batch's (scalars), as
  `SUMMED_METRICS` and `SUMMED_SUFFIX` say: sums for global-normalised loss terms, max /
  min for extremes, means otherwise."""

  def combine(name, values):
    if name in SUMMED_METRICS or name.endswith(SUMMED_SUFFIX):
      return jnp.sum(values, axis=0)
    if name.endswith("_max"):
      return jnp.max(values, axis=0)
    if name.endswith("_min"):
      return jnp.min(values, axis=0)
    return jnp.mean(values, axis=0)

  return {name: combine(name, values) for name, values in metrics.items()}


# loss_fn(params, batch, normalizers[, packed=...]) -> (loss, metrics);
# normalizer_fn(batch) -> normalizers
LossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


def minibatch_update(loss_fn: LossFn, normalizer_fn: Callable, has_target: Callable,
                     optimizer: optax.GradientTransformation, micro_batches: int):
  """((state, (minibatch, packed)) → (state, metrics): one optimizer step from the
  gradient summed over `micro_batches` slices (or, with `packed` buffers
  ([U, K, C] leading), over its U packed micro-batches, each passed to `loss_fn` as
  `packed=`). Skipped (state unchanged) when the loss or gradient is not finite or
  `has_target(minibatch)` is False; metrics `skipped` / `applied` say so. The loss and
  the metrics are the whole mini-batch's, whatever `micro_batches` (`combine_micro_metrics`)."""

  def step(state: TrainState, inputs):
    batch, packed = inputs
    norm = normalizer_fn(batch)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def micro_grad(piece):
      # Padded: a slice of the rows. Packed: one micro-batch's buffers; its rows are
      # picked out of the whole mini-batch by the loss.
      if packed is None:
        return grad_fn(state.params, piece, norm)
      return grad_fn(state.params, batch, norm, packed=piece)

    if micro_batches == 1 and packed is None:
      (loss, metrics), grads = micro_grad(batch)
    else:
      def accumulate(carry, piece):
        (loss, metrics), grads = micro_grad(piece)
        total_loss, total_grads = carry
        return (total_loss + loss, jax.tree.map(jnp.add, total_grads, grads)), metrics

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      pieces = _split_rows(batch, micro_batches) if packed is None else packed
      (loss, grads), metrics = jax.lax.scan(accumulate, (jnp.zeros(()), zeros), pieces)
      metrics = combine_micro_metrics(metrics)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    apply = finite & has_target(batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    new = TrainState(params=optax.apply_updates(state.params, updates), opt_state=opt_state)
    return _where(apply, new, state), dict(
        metrics, loss=loss, grad_norm=grad_norm, skipped=(~finite).astype(jnp.float32),
        applied=apply.astype(jnp.float32))

  return step


class TrainedRole:
  """A trained model (actor, critic): parameters and optimizer state on the mesh and
  one jitted, donated update over a whole rollout batch (see the module docstring).

  Args:
    model: the FunctionalModel.
    params: its parameters, already in the training layout.
    optimizer: the optax transformation.
    mesh: the device mesh.
    loss_fn: (params, batch, normalizers) → (loss, metrics).
    normalizer_fn: batch → the global counts `loss_fn` divides by.
    has_target: batch → bool scalar, whether the mini-batch has anything to learn.
    epochs: passes over the batch.
    minibatches: optimizer steps per pass.
    micro_batches: gradient-accumulation slices per optimizer step.
  """

  def __init__(self, model, params, optimizer: optax.GradientTransformation, mesh, *,
               loss_fn: LossFn, normalizer_fn: Callable, has_target: Callable,
               epochs: int, minibatches: int, micro_batches: int = 1):
    self.model = model
    self.mesh = mesh
    # Kept for a notebook or a test that evaluates the role's loss on a batch.
    self.loss_fn, self.normalizer_fn = loss_fn, normalizer_fn
    self.state = new_train_state(optimizer, params, mesh)
    step = minibatch_update(loss_fn, normalizer_fn, has_target, optimizer, micro_batches)
    self._update = self._build(step, epochs, minibatches)

  @property
  def params(self):
    """The current parameters."""
    return self.state.params

  def _build(self, step, epochs: int, minibatches: int):
    shards = math.prod(self.mesh.shape[axis] for axis in BATCH_AXES)
    # Mini-batch rows stay split over the batch axes after the shuffle when they divide.
    spread = jax.sharding.NamedSharding(
        self.mesh, jax.sharding.PartitionSpec(None, BATCH_AXES))

    def run(state: TrainState, batch, orders, packed):
      rows = jax.tree.leaves(batch)[0].shape[0]

      def epoch(state, inputs):
        order, epoch_packed = inputs
        minis = _split_rows(jax.tree.map(lambda x: x[order], batch), minibatches)
        if shards > 1 and (rows // minibatches) % shards == 0:
          minis = jax.lax.with_sharding_constraint(
              minis, jax.tree.map(lambda _: spread, minis))
        return jax.lax.scan(step, state, (minis, epoch_packed))

      state, metrics = jax.lax.scan(epoch, state, (orders, packed))
      return state, jax.tree.map(lambda m: m.reshape(-1), metrics)

    layout = jax.tree.map(lambda x: x.sharding, self.state)
    self._orders = jax.jit(lambda key, rows: jax.vmap(
        lambda k: jax.random.permutation(k, rows))(jax.random.split(key, epochs)),
        static_argnums=1)
    return jax.jit(run, donate_argnums=(0,), out_shardings=(layout, None))

  def update(self, batch, key: jax.Array, packer: Callable | None = None
             ) -> dict[str, jax.Array]:
    """Runs every epoch and mini-batch on `batch`; returns per-mini-batch metrics
    ([E·M] device arrays, not yet read).

    Args:
      batch: the rollout batch on the mesh.
      key: this update's key (each epoch's row order is a permutation drawn from it).
      packer: orders [E, B] (numpy) → packed buffers of every micro-batch ([E, M, U]
        leading axes, `models.packing.update_plan`), or None for padded forwards.
    """
    rows = jax.tree.leaves(batch)[0].shape[0]
    orders = self._orders(key, rows)
    packed = None if packer is None else on_mesh(
        jax.tree.map(jnp.asarray, packer(np.asarray(orders))), self.mesh)
    self.state, metrics = self._update(self.state, batch, orders, packed)
    return metrics


class FrozenRole:
  """A model whose parameters the optimizer never touches (the reference policy;
  later reward models and judges).

  Args:
    model: the FunctionalModel.
    params: its parameters (copied, so donating a trained role's state never
      frees them).
  """

  def __init__(self, model, params):
    self.model = model
    self.params = _copy(params)
    self._ema = jax.jit(lambda ref, new, rate: jax.tree.map(
        lambda r, p: (1 - rate) * r + rate * p, ref, new), donate_argnums=(0,))

  def move_toward(self, params, rate: float) -> None:
    """params_ref ← (1 − rate)·params_ref + rate·params (an EMA reference), in place."""
    self.params = self._ema(self.params, params, jnp.float32(rate))
