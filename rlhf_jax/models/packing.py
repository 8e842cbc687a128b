"""Padding-free forwards: the rows of a rollout batch packed into fixed token buffers.

A rollout row is [prompt, left-padded to P | response, right-padded to R], so a
batch of short answers in a long budget is mostly padding, and the forward pays for
all of it. Packing lays the real tokens of several rows end to end in buffers of C
tokens; each row is a segment with its own positions (0, 1, ... as in the padded
forward), and attention stays inside a segment (the decoder's `segment_ids`). Only
the hidden states that predict response tokens are gathered back into the [B, R]
layout, so log-probs, values and every kernel downstream see the padded shapes.

The plan is made on the host from the row lengths (first-fit decreasing), in numpy;
its arrays go to the device with the batch. Buffer counts are rounded up to a
multiple of an eighth of the count that always suffices (`buffer_buckets`), so each
packed program compiles at most eight shapes (in a steady run two or three)
(verl, OpenRLHF and slime remove padding the same way; they balance micro-batches by
tokens as `split_rows` does).

Spans: a row's segment covers columns [P − prompt_len, P + response_len) of the
whole row (`tokens`, [b, P + R]): the prompt's real tokens and every response
token. The last one predicts nothing we score, but it is causally after everything
that is scored, so it changes no hidden state that is read; it keeps the forwards'
lengths even (`PACK_ALIGN`). The hidden state at column P − 1 + t predicts response
token t.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.models.moe.routing import NOT_RECORDED

# Tokens per buffer are a multiple of this (of the power of two ≥ P + R for shorter
# rows): cuDNN's flash attention refuses odd lengths, Pallas kernels want whole blocks
# (of min(block, C) tokens), and GEMMs run on aligned row counts.
PACK_ALIGN = 128
# Rows per buffer at most: the segments a fused kernel's packed description holds
# (`attention.cudnn` describes a buffer with a static bound); a buffer of many short
# rows opens another instead.
MAX_ROWS_PER_BUFFER = 32


@flax.struct.dataclass
class PackedRows:
  """Where each real token of b rows goes in K buffers of C tokens.

  Attributes:
    source: [K, C] int32 flat index into the rows' tokens [b, W], W = P + R
      (row · W + column), −1 on buffer padding.
    positions: [K, C] int32 RoPE position of each token within its row.
    segments: [K, C] int32 row + 1 of each token, 0 on buffer padding.
    response_index: [b, R] int32 flat index into the packed hidden states [K · C]
      of the state that predicts each response token; −1 where the row has no such
      token (past its length, or a row not in these buffers).
  """
  source: jax.Array
  positions: jax.Array
  segments: jax.Array
  response_index: jax.Array

  @property
  def buffers(self) -> int:
    """K."""
    return self.source.shape[-2]


def row_spans(prompt_lengths: np.ndarray, response_lengths: np.ndarray, prompt_width: int
              ) -> tuple[np.ndarray, np.ndarray]:
  """(start, end) columns of each row's segment in the [P + R] row; end − start is
  its token count, prompt_len + response_len (0 for a row without response tokens)."""
  prompt_lengths = np.asarray(prompt_lengths, np.int64)
  response_lengths = np.asarray(response_lengths, np.int64)
  start = prompt_width - prompt_lengths
  end = np.where(response_lengths > 0, prompt_width + response_lengths, start)
  return start, end


def buffer_capacity(row_width: int) -> int:
  """C: tokens per buffer for rows of `row_width` (P + R) tokens: rounded up to a
  multiple of PACK_ALIGN, or, for rows shorter than that, to a power of two (short
  rows would otherwise pay for up to PACK_ALIGN slots a buffer). A whole row fits;
  packed forwards cost ≤ C / (P + R) of the padded ones in the worst case (a full
  batch), < 1.125 for P + R ≥ 1024."""
  align = min(PACK_ALIGN, 1 << max(row_width - 1, 0).bit_length())
  return -(-row_width // align) * align


def most_buffers(rows: int, row_width: int, capacity: int) -> int:
  """Buffers that always suffice for `rows` rows of ≤ `row_width` tokens: first-fit
  opens a bin only when every open one holds ≥ ⌊C / row_width⌋ rows (a bin with
  fewer has room for any row) or `MAX_ROWS_PER_BUFFER` rows."""
  per_buffer = min(max(1, capacity // row_width), MAX_ROWS_PER_BUFFER)
  return max(1, -(-rows // per_buffer))


def first_fit_decreasing(sizes: np.ndarray, capacity: int,
                         max_items: int = MAX_ROWS_PER_BUFFER) -> list[list[int]]:
  """Bins of item indices, each holding at most `capacity` in total and `max_items`
  items: items by decreasing size, each into the first bin with room (≤ 11/9 OPT + 1
  bins without the item bound)."""
  bins: list[list[int]] = []
  room: list[int] = []
  for item in np.argsort(-np.asarray(sizes), kind="stable"):
    size = int(sizes[item])
    if size > capacity:
      raise ValueError(f"row {item} has {size} tokens, more than a buffer's {capacity}.")
    for index, free in enumerate(room):
      if size <= free and len(bins[index]) < max_items:
        bins[index].append(int(item))
        room[index] -= size
        break
    else:
      bins.append([int(item)])
      room.append(capacity - size)
  return bins


def split_rows(sizes: np.ndarray, parts: int) -> list[list[int]]:
  """`parts` groups of row indices with near-equal token totals (longest row first
  into the lightest group: Graham's LPT, ≤ 4/3 of the best largest total)."""
  groups: list[list[int]] = [[] for _ in range(parts)]
  totals = np.zeros(parts, np.int64)
  for item in np.argsort(-np.asarray(sizes), kind="stable"):
    lightest = int(np.argmin(totals))
    groups[lightest].append(int(item))
    totals[lightest] += int(sizes[item])
  return [sorted(group) for group in groups]


def buffer_buckets(most: int) -> tuple[int, ...]:
  """The buffer counts a packed forward compiles for: the multiples of ⌈N/8⌉ up to N,
  where N = `most` (the count that always suffices, `most_buffers`).

  At most eight shapes per program (each a full compile, and on a GPU an autotuning
  pass); a run's step-to-step needs vary little, so it meets two or three of them.
  Waste is below ⌈N/8⌉ buffers. Three coarser buckets (N/4, N/2, N) cost ~30 % more
  token slots on log-normal response lengths (up to 2× a need just above a bucket).
  """
  step = max(1, -(-most // 8))
  return tuple(sorted({min(most, step * i) for i in range(1, -(-most // step) + 1)}))


def bucketed(needed: int, most: int) -> int:
  """The buffer count for a need of `needed`: the smallest of `buffer_buckets(most)`
  that holds it; a need above N (a micro-batch whose token-balanced rows outnumber
  its share, `update_plan`) rounds up to a multiple of N."""
  for count in buffer_buckets(most):
    if needed <= count:
      return count
  return -(-needed // most) * most


def plan_rows(rows: list[int], starts: np.ndarray, ends: np.ndarray, *, num_rows: int,
              width: int, prompt_width: int, response_width: int, capacity: int,
              buffers: int | None = None) -> dict[str, np.ndarray]:
  """The PackedRows arrays (numpy) for `rows` of a b-row batch (`num_rows` = b).

  Args:
    rows: the rows to pack (indices < num_rows); the others get response_index −1.
    starts: every row's first column (`row_spans`).
    ends: every row's end column, exclusive.
    width: W, columns per row (P + R).
    prompt_width: P.
    response_width: R.
    capacity: C, tokens per buffer (≥ the longest span).
    buffers: K, or None for as many as first-fit decreasing needs.
  """
  sizes = ends[rows] - starts[rows]
  bins = [[rows[i] for i in b] for b in first_fit_decreasing(sizes, capacity)]
  buffers = len(bins) if buffers is None else buffers
  if len(bins) > buffers:
    raise ValueError(f"{len(bins)} buffers needed, {buffers} allowed.")
  source = np.full((buffers, capacity), -1, np.int32)
  positions = np.zeros((buffers, capacity), np.int32)
  segments = np.zeros((buffers, capacity), np.int32)
  response_index = np.full((num_rows, response_width), -1, np.int32)
  for k, members in enumerate(bins):
    offset = 0
    for row in members:
      count = int(ends[row] - starts[row])
      if count == 0:  # no response token: nothing to forward or score
        continue
      span = slice(offset, offset + count)
      source[k, span] = row * width + np.arange(starts[row], ends[row])
      positions[k, span] = np.arange(count)
      segments[k, span] = row + 1
      responses = count - (prompt_width - starts[row])  # = response length
      first = k * capacity + offset + (prompt_width - 1 - starts[row])
      response_index[row, :responses] = first + np.arange(responses)
      offset += count
  return dict(source=source, positions=positions, segments=segments,
              response_index=response_index)


def batch_plan(prompt_lengths: np.ndarray, response_lengths: np.ndarray, *, prompt_width: int,
               response_width: int) -> PackedRows:
  """All rows of a batch in one set of buffers (the forwards of `prepare`), the buffer
  count one of `buffer_buckets`; host (numpy) arrays."""
  starts, ends = row_spans(prompt_lengths, response_lengths, prompt_width)
  rows = list(range(len(starts)))
  width = prompt_width + response_width
  capacity = buffer_capacity(width)
  needed = len(first_fit_decreasing(ends - starts, capacity))
  buffers = bucketed(needed, most_buffers(len(rows), width, capacity))
  return PackedRows(**plan_rows(rows, starts, ends, num_rows=len(rows), width=width,
                                prompt_width=prompt_width, response_width=response_width,
                                capacity=capacity, buffers=buffers))


def update_plan(orders: np.ndarray, prompt_lengths: np.ndarray, response_lengths: np.ndarray,
                *, prompt_width: int, response_width: int, minibatches: int,
                micro_batches: int) -> PackedRows:
  """Buffers for every micro-batch of an update: leading axes [E, M, U].

  Epoch e's mini-batch m holds rows `orders[e, m·b:(m+1)·b]` (b = B / M, local
  indices 0..b−1 in that order); its rows are split into U micro-batches of
  near-equal token counts (`split_rows`), each packed into the same K buffers
  (the largest need of the step, bucketed by `bucketed` against the buffers that
  always suffice for a micro-batch's share of b / U rows).
  """
  epochs, rows = orders.shape
  per_mini = rows // minibatches
  starts, ends = row_spans(prompt_lengths, response_lengths, prompt_width)
  width = prompt_width + response_width
  capacity = buffer_capacity(width)
  groups = []
  for order in orders:
    for m in range(minibatches):
      members = order[m * per_mini:(m + 1) * per_mini]
      local_starts, local_ends = starts[members], ends[members]
      for group in split_rows(local_ends - local_starts, micro_batches):
        groups.append((group, local_starts, local_ends))
  needed = max(len(first_fit_decreasing(e[g] - s[g], capacity)) if g else 0
               for g, s, e in groups)
  share = -(-per_mini // micro_batches)
  buffers = bucketed(needed, most_buffers(share, width, capacity))
  plans = [plan_rows(g, s, e, num_rows=per_mini, width=width, prompt_width=prompt_width,
                     response_width=response_width, capacity=capacity, buffers=buffers)
           for g, s, e in groups]
  stacked = {key: np.stack([p[key] for p in plans]).reshape(
      epochs, minibatches, micro_batches, *plans[0][key].shape) for key in plans[0]}
  return PackedRows(**stacked)


def pack_inputs(inputs: jax.Array, packed: PackedRows, fill=0) -> jax.Array:
  """[b, W, ...] row inputs → [K, C, ...] buffer inputs (`fill` on buffer padding)."""
  flat = inputs.reshape(-1, *inputs.shape[2:])
  present = (packed.source >= 0).reshape(packed.source.shape + (1,) * (inputs.ndim - 2))
  return jnp.where(present, flat[jnp.maximum(packed.source, 0)],
                   jnp.asarray(fill, inputs.dtype))


def unpack_responses(hidden: jax.Array, packed: PackedRows) -> jax.Array:
  """[K, C, ...] per-buffer-token values → [b, R, ...] at the response positions
  (zeros where `response_index` is −1)."""
  flat = hidden.reshape(-1, *hidden.shape[2:])
  picked = flat[jnp.maximum(packed.response_index, 0)]
  present = (packed.response_index >= 0).reshape(
      packed.response_index.shape + (1,) * (hidden.ndim - 2))
  return jnp.where(present, picked, jnp.zeros((), hidden.dtype))


def unpack_rows(values: jax.Array, packed: PackedRows, rows: int, width: int,
                fill=0) -> jax.Array:
  """[K, C, ...] per-buffer-token values → [b, W, ...] at their rows' columns (`fill`
  where no buffer token lands: past a row's length, rows not in these buffers); the
  inverse of `pack_inputs` on real tokens."""
  flat = values.reshape(-1, *values.shape[2:])
  target = jnp.where(packed.source >= 0, packed.source, rows * width).reshape(-1)
  out = jnp.full((rows * width,) + values.shape[2:], fill, values.dtype)
  return out.at[target].set(flat, mode="drop").reshape(rows, width, *values.shape[2:])


def response_hidden(module, tokens: jax.Array, *, num_last: int,
                    packed: PackedRows | None = None, with_router: bool = False,
                    **forward):
  """A `DecoderLM`'s final-normed hidden states that predict the last `num_last`
  tokens of the rows `tokens` [b, W] (W = P + R, R = num_last): columns
  [W − R − 1, W − 1), [b, R, E]. The forward runs on all W tokens (an even, aligned
  length; the last token is causally after every state read). From the padded rows
  (`forward` holds their attention_mask [b, W]), or from their packed buffers when
  `packed` is given (then `forward` may hold only arguments that do not describe the
  rows' layout). With `with_router` (a mixture-of-experts model), (hidden, the forward's
  `moe.RouterRecord` with its routes [b, W, L, k] at the rows' columns)."""
  if packed is None:
    out = module(tokens, num_last=num_last + 1, apply_head=False, with_router=with_router,
                 **forward)
    return (out[0][:, :-1], out[2]) if with_router else out[0][:, :-1]
  if forward.get("replay_routes") is not None:  # [b, W, L, k] rows → their buffers
    forward["replay_routes"] = pack_inputs(forward["replay_routes"], packed, fill=NOT_RECORDED)
  out = module(pack_inputs(tokens, packed), positions=packed.positions,
               segment_ids=packed.segments, attention_mask=packed.segments > 0,
               apply_head=False, with_router=with_router, **forward)
  hidden = unpack_responses(out[0], packed)
  if not with_router:
    return hidden
  record = out[2]
  rows = lambda routes: unpack_rows(routes, packed, *tokens.shape, fill=NOT_RECORDED)
  return hidden, record._replace(routes=rows(record.routes), live=rows(record.live))


def padding_fraction(real_tokens: int, total_tokens: int) -> float:
  """Share of a forward's token slots that hold no real token."""
  return 1.0 - real_tokens / max(total_tokens, 1)
