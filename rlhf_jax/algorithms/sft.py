"""Supervised fine-tuning on (prompt, solution) rows: the warm start before RL.

The batch layout is the rollout layout (prompt left-padded to P, solution +
EOS right-padded to R), so SFT reuses `response_logprobs`: the loss is the
token-mean negative log-likelihood of the solution tokens.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from rlhf_jax import kernels
from rlhf_jax import batch as batch_lib
from rlhf_jax.models import packing as packing_lib
from rlhf_jax.models.packing import PackedRows
from rlhf_jax.optim import FitResult
from rlhf_jax.optim import fit


def sft_loss(model, params, batch: batch_lib.RolloutBatch,
             packed: PackedRows | None = None) -> jax.Array:
  """Token-mean negative log-likelihood of the masked response tokens, from the padded
  rows or, with `packed`, from the rows packed into buffers (models/packing.py)."""
  logprobs = batch_lib.response_logprobs(model, params, batch, packed=packed)
  return -kernels.aggregate(logprobs, batch.response_mask, mode="token-mean")


def run_sft(model, params, make_batch: Callable[[int], Any], *, steps: int,
            learning_rate: float, **options) -> FitResult:
  """Trains the LM on `make_batch(step)` batches of (prompt, response) rows, a
  RolloutBatch or (RolloutBatch, PackedRows) (`fit` of `sft_loss`; options:
  warmup_steps, weight_decay, max_grad_norm, progress)."""
  def loss(p, batch):
    return sft_loss(model, p, *batch) if isinstance(batch, tuple) else sft_loss(model, p, batch)

  return fit(loss, params, make_batch, steps=steps, learning_rate=learning_rate, **options)


def supervised_batches(rows, *, batch_size: int, seed: int, prompt_length: int,
                       response_length: int, pad_id: int, packing: bool = False
                       ) -> Callable[[int], Any]:
  """`make_batch(step)` for run_sft over fixed `data.conversations.SupervisedRow`s: each
  epoch a fresh seeded shuffle, `batch_size` rows a step (the loss on each row's masked
  tokens: the assistant's). With `packing`, each batch comes with its packed-buffer plan
  (buffer counts in multiples of an eighth of the rows: at most eight shapes compile)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  if not rows:
    raise ValueError("supervised_batches needs at least one row.")

  orders: dict[int, np.ndarray] = {}  # epoch → its shuffle (a step spans at most two)

  def order(epoch: int) -> np.ndarray:
    if epoch not in orders:
      if len(orders) > 1:  # keep two epochs: the one ending and the one starting
        orders.clear()
      orders[epoch] = np.random.default_rng([seed, epoch]).permutation(len(rows))
    return orders[epoch]

  def make_batch(step: int) -> batch_lib.RolloutBatch:
    picked = []
    for position in range(step * batch_size, (step + 1) * batch_size):
      epoch, index = divmod(position, len(rows))
      picked.append(rows[order(epoch)[index]])
    batch = batch_lib.build_rollout_batch(
        [r.prompt_ids for r in picked], [r.response_ids for r in picked],
        [[0.0] * len(r.response_ids) for r in picked], [0.0] * batch_size,
        [False] * batch_size, list(range(batch_size)), prompt_length=prompt_length,
        response_length=response_length, pad_id=pad_id,
        loss_masks=[r.loss_mask for r in picked])
    if not packing:
      return batch
    return batch, packing_lib.batch_plan(
        np.array([len(r.prompt_ids) for r in picked]),
        np.array([len(r.response_ids) for r in picked]), prompt_width=prompt_length,
        response_width=response_length)

  return make_batch
