"""`train.packing`: the packed-buffer plans of one rollout batch's forwards (the
prepare's and every micro-batch's of the updates), and the padding they remove.

The plans are made on the host from the rows' prompt and response lengths
(`models.packing`); buffer counts are rounded up to eighths of the count that
always suffices (`packing.buffer_buckets`), so a run compiles at most eight shapes of
each program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax import parallel

from rlhf_jax.models import packing


class RowPacker:
  """Packs a PPO-family batch for its forwards.

  Args:
    minibatches: M, optimizer steps per epoch.
    micro_batches: U, gradient-accumulation slices per optimizer step; each is
      packed into its own buffers, the rows split by token count.
  """

  def __init__(self, minibatches: int, micro_batches: int):
    self.minibatches = minibatches
    self.micro_batches = micro_batches

  def for_batch(self, batch) -> "BatchPacking":
    """The plans of `batch` (a RolloutBatch on device; reads its [B] lengths)."""
    prompt_width = batch.tokens.shape[1] - batch.response_length
    prompt_lengths, lengths = parallel.host_values(
        (jnp.sum(batch.attention_mask[:, :prompt_width], axis=1), batch.lengths))
    return BatchPacking(np.asarray(prompt_lengths), np.asarray(lengths),
                        prompt_width=prompt_width, response_width=batch.response_length,
                        minibatches=self.minibatches, micro_batches=self.micro_batches)


class BatchPacking:
  """One batch's plans and padding figures (see `RowPacker`)."""

  def __init__(self, prompt_lengths: np.ndarray, lengths: np.ndarray, *, prompt_width: int,
               response_width: int, minibatches: int, micro_batches: int):
    self.prompt_lengths, self.lengths = prompt_lengths, lengths
    self.widths = dict(prompt_width=prompt_width, response_width=response_width)
    self.minibatches, self.micro_batches = minibatches, micro_batches
    rows = len(lengths)
    starts, ends = packing.row_spans(prompt_lengths, lengths, prompt_width)
    self.real_tokens = int(np.sum(ends - starts))
    self.row_width = prompt_width + response_width
    self.padded_tokens = rows * self.row_width
    self._whole = packing.batch_plan(prompt_lengths, lengths, **self.widths)
    self._update_slots = None

  def whole_batch(self) -> packing.PackedRows:
    """Every row in one set of buffers (device arrays): the prepare's forwards."""
    return jax.tree.map(jnp.asarray, self._whole)

  def update_plan(self, orders: np.ndarray) -> packing.PackedRows:
    """The buffers of every micro-batch of an update whose epochs visit the rows in
    `orders` [E, B] (host arrays; `TrainedRole.update`'s packer)."""
    plan = packing.update_plan(orders, self.prompt_lengths, self.lengths,
                               minibatches=self.minibatches, micro_batches=self.micro_batches,
                               **self.widths)
    self._update_slots = plan.source.size // orders.shape[0]  # buffer tokens per epoch
    return plan

  def metrics(self) -> dict[str, float]:
    """Share of padding in the forwards: padded rows, the prepare's buffers, and the
    update's buffers (per epoch) when one ran."""
    out = {"packing/padding_fraction_padded": packing.padding_fraction(
               self.real_tokens, self.padded_tokens),
           "packing/padding_fraction_prepare": packing.padding_fraction(
               self.real_tokens, self._whole.source.size)}
    if self._update_slots is not None:
      out["packing/padding_fraction_update"] = packing.padding_fraction(
          self.real_tokens, self._update_slots)
    return out
