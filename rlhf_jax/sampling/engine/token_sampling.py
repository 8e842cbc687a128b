"""Drawing one token per row from logits, with per-row parameters (pure, jittable).

Every parameter is a [B] array, so one compiled program serves any mix of
requests. Each drawn token comes with two log-probabilities:

  sampled_logprob  log q(token): q is the distribution it was drawn from
                   (temperature, top-k, top-p, min-p applied; 0 for greedy);
  model_logprob    log π(token) = log_softmax(logits)[token]: the plain model
                   at temperature 1 with no truncation — what PPO's ratio
                   π_θ/π_old needs as π_old.

A draw reads the [B, V] logits once (`_block_stats`: one variadic reduction over blocks
of the vocabulary) and then only one block per row: a blocked inverse CDF.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

_NEG_INF = -jnp.inf


def truncation_mask(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array,
                    min_p: jax.Array) -> jax.Array:
  """Which tokens survive top-k, then top-p, then min-p (HF's warper order).

  Args:
    scaled: [B, V] float32 logits already divided by the temperature.
    top_k: [B] int, 0 = no limit. Ties with the k-th value are kept (as HF).
    top_p: [B] float in (0, 1]: keep the most likely tokens until their mass,
      renormalised after top-k, reaches top_p (at least one token).
    min_p: [B] float in [0, 1): keep p ≥ min_p · max p.
  Returns:
    [B, V] bool.
  """
  vocab = scaled.shape[-1]
  ordered = -jnp.sort(-scaled, axis=-1)  # descending
  kth = jnp.take_along_axis(ordered, jnp.clip(top_k - 1, 0, vocab - 1)[:, None], axis=-1)
  kth = jnp.where(top_k[:, None] > 0, kth, _NEG_INF)
  ordered = jnp.where(ordered >= kth, ordered, _NEG_INF)
  probs = jax.nn.softmax(ordered, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep_count = jnp.maximum(jnp.sum(mass_before < top_p[:, None], axis=-1), 1)
  top_p_value = jnp.take_along_axis(ordered, keep_count[:, None] - 1, axis=-1)
  # min-p in logit space: p ≥ min_p·p_max ⇔ logit ≥ max logit + log(min_p).
  min_p_value = ordered[:, :1] + jnp.log(jnp.maximum(min_p[:, None], 1e-30))
  min_p_value = jnp.where(min_p[:, None] > 0, min_p_value, _NEG_INF)
  threshold = jnp.maximum(jnp.maximum(kth, top_p_value), min_p_value)
  return scaled >= threshold


def sample_tokens(logits: jax.Array, keys: jax.Array, *, temperature: jax.Array,
                  top_k: jax.Array, top_p: jax.Array, min_p: jax.Array,
                  truncate: bool = True) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Draws one token per row from the truncated, tempered softmax (inverse CDF).

  One uniform number u per row picks the first token whose cumulative weight
  exceeds u · total (~3× cheaper on CPU than Gumbel-max, which needs V random
  numbers per row). The CDF is blocked: one pass over the logits gives each
  vocabulary block's maximum and sum of exp (`_block_stats`); u picks the block
  from the block sums, then the token from the cumulative weights inside that
  block alone. Same draw as a full-vocabulary cumsum up to float rounding at block
  and token boundaries. Greedy rows take the first maximal logit (`jnp.argmax`).

  Args:
    logits: [B, V] next-token logits (any float dtype; computed in float32).
    keys: [B] typed PRNG keys, one per row, so a row's draw depends on its own
      key only, never on the other rows.
    temperature: [B] float, 0 = greedy.
    top_k: [B] per-row top-k (see `truncation_mask`).
    top_p: [B] per-row top-p.
    min_p: [B] per-row min-p.
    truncate: static. False: no row needs truncation and top_k / top_p / min_p are
      ignored (the sort behind `truncation_mask` costs more than the rest of sampling
      together; the engine decides this on the host, so the step holds no
      conditional). True: rows that need it are truncated; the others draw exactly
      the tokens they draw with False.
  Returns:
    (tokens [B] int32, sampled_logprobs [B], model_logprobs [B]) as described
    in the module docstring.
  """
  logits = logits.astype(jnp.float32)
  batch, vocab = logits.shape
  greedy = temperature <= 0
  inverse_t = 1.0 / jnp.where(greedy, 1.0, temperature)[:, None]
  keep = None
  if truncate:
    needs_truncation = (top_k > 0) | (top_p < 1) | (min_p > 0)
    keep = (truncation_mask(logits * inverse_t, top_k, top_p, min_p)
            | ~(needs_truncation & ~greedy)[:, None])
  nb, size = _blocks(vocab)
  stats = _block_stats(logits.reshape(batch, nb, size), inverse_t[:, :, None],
                       None if keep is None else keep.reshape(batch, nb, size))
  model_max, model_sum, top, weight = stats  # [B, nb] each
  peak = jnp.max(model_max, axis=-1)
  lse = peak + jnp.log(jnp.sum(model_sum * _rescale(model_max, peak[:, None]), axis=-1))
  scaled_peak = jnp.max(top, axis=-1, keepdims=True)
  block_weight = weight * _rescale(top, scaled_peak)  # [B, nb], relative to exp(peak)
  cumulative = jnp.cumsum(block_weight, axis=-1)
  total = cumulative[:, -1]
  uniform = jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(keys)
  target = uniform * total
  block = _first_above(cumulative, target, block_weight > 0)
  block = jnp.where(greedy, jnp.argmax(model_max, axis=-1).astype(jnp.int32), block)
  before = jnp.take_along_axis(cumulative - block_weight, block[:, None], axis=-1)[:, 0]
  index, rows, scaled = _pick_in_block(logits.reshape(batch, nb, size), keep, block,
                                       inverse_t, scaled_peak,
                                       jnp.maximum(target - before, 0.0))
  index = jnp.where(greedy, jnp.argmax(rows, axis=-1).astype(jnp.int32), index)
  pick = lambda table: jnp.take_along_axis(table, index[:, None], axis=-1)[:, 0]
  sampled_logprobs = jnp.where(greedy, 0.0, pick(scaled) - scaled_peak[:, 0] - jnp.log(total))
  return block * size + index, sampled_logprobs, pick(rows) - lse


def _pick_in_block(blocks, keep, block, inverse_t, scaled_peak, residual):
  """Inside each row's chosen block (a [B, size] gather, not a pass over V): the first
  token whose cumulative weight exp(x / T − peak) exceeds `residual`. Returns (index in
  the block, the block's logits, its tempered and truncated logits)."""
  take = lambda x: jnp.take_along_axis(x, block[:, None, None], axis=1)[:, 0]
  rows = take(blocks)
  scaled = rows * inverse_t
  if keep is not None:
    scaled = jnp.where(take(keep.reshape(blocks.shape)), scaled, _NEG_INF)
  inner = jnp.exp(scaled - scaled_peak)  # 0 where truncated
  return _first_above(jnp.cumsum(inner, axis=-1), residual, inner > 0), rows, scaled


def _blocks(vocab: int) -> tuple[int, int]:
  """(blocks, block size) with blocks · size = V: the divisor of V nearest below √V
  blocks (a reshape, not a padded copy; 151936 = 128 × 1187)."""
  count = max(d for d in range(1, math.isqrt(vocab) + 1) if vocab % d == 0)
  return count, vocab // count


def _rescale(maximum: jax.Array, peak: jax.Array) -> jax.Array:
  """exp(maximum − peak), 1 where both are −∞ (an empty block's sum stays its own)."""
  return jnp.where(maximum == peak, 1.0, jnp.exp(maximum - peak))


def _block_stats(blocks: jax.Array, inverse_t: jax.Array, keep: jax.Array | None):
  """One pass over [B, nb, size] logits: per block the max and Σ exp(x − max) of the
  logits (the model's distribution) and of x / T where kept (the sampling one): an
  online log-sum-exp as one variadic reduction, so the logits are read once."""
  scaled = blocks * inverse_t
  if keep is not None:
    scaled = jnp.where(keep, scaled, _NEG_INF)
  one = jnp.ones_like(blocks)

  def combine(a, b):
    (m1, s1, n1, t1), (m2, s2, n2, t2) = a, b
    m, n = jnp.maximum(m1, m2), jnp.maximum(n1, n2)
    return (m, s1 * _rescale(m1, m) + s2 * _rescale(m2, m),
            n, t1 * _rescale(n1, n) + t2 * _rescale(n2, n))

  init = (jnp.float32(-jnp.inf), jnp.float32(0), jnp.float32(-jnp.inf), jnp.float32(0))
  return jax.lax.reduce((blocks, one, scaled, one), init, combine, (2,))


def _first_above(cumulative: jax.Array, target: jax.Array, positive: jax.Array) -> jax.Array:
  """Per row, the first index whose cumulative weight exceeds `target`, never one of zero
  weight: at most the last positive index (u · total can round up to the total, p ≈ 2⁻²⁴)
  and at least the first (a block's residual target − before can round below 0)."""
  count = jnp.sum(cumulative <= target[:, None], axis=-1, dtype=jnp.int32)
  iota = jnp.arange(cumulative.shape[-1], dtype=jnp.int32)
  last = jnp.max(jnp.where(positive, iota, -1), axis=-1)
  first = jnp.argmax(positive, axis=-1).astype(jnp.int32)
  return jnp.clip(count, first, last)


def draw_for_slots(logits: jax.Array, sampling, generated: jax.Array, last_token: jax.Array,
                   newline: jax.Array, *, truncate: bool
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Each slot's token number `generated` of its sample, drawn from `logits` with the
  slot's parameters and key fold_in(key, generated) (see `sample_tokens`).

  FIRE (arXiv:2410.21236): the hot parameters at a sample's first token and, in
  every-line mode, after a token that ends a line.

  Args:
    logits: [S, V] next-token logits.
    sampling: `SlotSampling` with a leading [S] axis.
    generated: [S] int32 tokens the sample has emitted so far.
    last_token: [S] int32 its last emitted token (-1 before the first).
    newline: [V] bool, tokens whose text ends a line.
    truncate: static, as `sample_tokens` (`needs_truncation` decides it on the host).
  Returns:
    (tokens, sampled_logprobs, model_logprobs), [S] each.
  """
  s = sampling
  after_newline = (last_token >= 0) & newline[jnp.maximum(last_token, 0)]
  hot = s.fire & ((generated == 0) | (s.fire_every_line & after_newline))
  keys = jax.vmap(lambda data, t: jax.random.fold_in(jax.random.wrap_key_data(data), t))(
      s.key, generated)
  return sample_tokens(logits, keys,
                       temperature=jnp.where(hot, s.fire_temperature, s.temperature),
                       top_k=jnp.where(hot, s.fire_top_k, s.top_k),
                       top_p=jnp.where(hot, 1.0, s.top_p),
                       min_p=jnp.where(hot, 0.0, s.min_p), truncate=truncate)


def needs_truncation(sampling) -> bool:
  """Host side: whether any draw with these parameters (a `SlotSampling`, one slot's or
  with a leading axis, as host arrays) may need top-k / top-p / min-p truncation: the
  static `truncate` of `draw_for_slots`. Greedy draws never do."""
  get = lambda name: np.asarray(getattr(sampling, name))
  cold = (get("top_k") > 0) | (get("top_p") < 1) | (get("min_p") > 0)
  hot = get("fire") & (get("fire_top_k") > 0)
  return bool(np.any((cold & (get("temperature") > 0))
                     | (hot & (get("fire_temperature") > 0))))
