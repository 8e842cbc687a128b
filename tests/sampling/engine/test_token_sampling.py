"""Per-row token sampling against NumPy references written from HF's warper order."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.sampling import sample_tokens
from rlhf_jax.sampling import truncation_mask
from rlhf_jax.sampling.engine.token_sampling import needs_truncation


def reference_keep(scaled, top_k, top_p, min_p):
  """HF order: top-k (ties kept), then top-p on what is left, then min-p; one row."""
  keep = np.ones_like(scaled, bool)
  if top_k > 0:
    kth = np.sort(scaled)[::-1][top_k - 1]
    keep &= scaled >= kth
  if top_p < 1:
    masked = np.where(keep, scaled, -np.inf)
    probs = np.exp(masked - masked.max())
    probs /= probs.sum()
    order = np.argsort(-masked, kind="stable")
    mass, kept = 0.0, np.zeros_like(keep)
    for index in order:
      if mass >= top_p:
        break
      kept[index] = True
      mass += probs[index]
    threshold = masked[kept].min()
    keep &= masked >= threshold
  if min_p > 0:
    masked = np.where(keep, scaled, -np.inf)
    probs = np.exp(masked - masked.max())
    keep &= probs >= min_p * probs.max()
  return keep


def rows(seed=0, batch=6, vocab=40):
  rng = np.random.default_rng(seed)
  logits = rng.standard_normal((batch, vocab)).astype(np.float32) * 2
  logits[0, :5] = logits[0, 5]  # ties at the k-th value
  return logits


@pytest.mark.parametrize("top_k,top_p,min_p", [
    (0, 1.0, 0.0), (5, 1.0, 0.0), (1, 1.0, 0.0), (0, 0.7, 0.0), (0, 1.0, 0.2), (8, 0.6, 0.1),
    (40, 0.95, 0.0), (3, 0.01, 0.0)])
def test_truncation_mask_matches_reference(top_k, top_p, min_p):
  logits = rows()
  batch = logits.shape[0]
  got = truncation_mask(jnp.asarray(logits), jnp.full((batch,), top_k, jnp.int32),
                        jnp.full((batch,), top_p, jnp.float32),
                        jnp.full((batch,), min_p, jnp.float32))
  expected = np.stack([reference_keep(row, top_k, top_p, min_p) for row in logits])
  np.testing.assert_array_equal(np.asarray(got), expected)
  assert np.all(np.asarray(got).sum(-1) >= 1)


def call(logits, keys, temperature, top_k=0, top_p=1.0, min_p=0.0):
  batch = logits.shape[0]
  full = lambda value, dtype: jnp.broadcast_to(jnp.asarray(value, dtype), (batch,))
  return jax.jit(sample_tokens)(jnp.asarray(logits), keys,
                                temperature=full(temperature, jnp.float32),
                                top_k=full(top_k, jnp.int32), top_p=full(top_p, jnp.float32),
                                min_p=full(min_p, jnp.float32))


def test_logprobs_are_those_of_the_two_distributions():
  logits = rows(1)
  keys = jax.random.split(jax.random.key(0), logits.shape[0])
  temperature, top_k = 0.7, 6
  tokens, sampled, model = map(np.asarray, call(logits, keys, temperature, top_k=top_k))
  for row, token in enumerate(tokens):
    scaled = logits[row] / temperature
    keep = reference_keep(scaled, top_k, 1.0, 0.0)
    assert keep[token]
    truncated = np.where(keep, scaled, -np.inf)
    q = truncated - truncated.max() - np.log(np.exp(truncated - truncated.max()).sum())
    p = logits[row] - logits[row].max() - np.log(np.exp(logits[row] - logits[row].max()).sum())
    np.testing.assert_allclose(sampled[row], q[token], atol=1e-5)
    np.testing.assert_allclose(model[row], p[token], atol=1e-5)


def test_greedy_is_argmax_with_zero_sampled_logprob():
  logits = rows(2)
  keys = jax.random.split(jax.random.key(0), logits.shape[0])
  tokens, sampled, _ = call(logits, keys, 0.0, top_k=3)
  np.testing.assert_array_equal(tokens, logits.argmax(-1))
  np.testing.assert_array_equal(sampled, 0.0)


def test_draws_follow_the_truncated_distribution():
  vocab, draws = 8, 20000
  base = np.linspace(-1.0, 1.5, vocab).astype(np.float32)
  logits = np.broadcast_to(base, (draws, vocab))
  keys = jax.random.split(jax.random.key(3), draws)
  temperature, top_k = 0.8, 5
  tokens = np.asarray(call(logits, keys, temperature, top_k=top_k)[0])
  scaled = base / temperature
  keep = reference_keep(scaled, top_k, 1.0, 0.0)
  probs = np.where(keep, np.exp(scaled - scaled.max()), 0)
  probs /= probs.sum()
  freq = np.bincount(tokens, minlength=vocab) / draws
  # 5 standard errors of a binomial frequency.
  tolerance = 5 * np.sqrt(probs * (1 - probs) / draws) + 1e-9
  assert np.all(np.abs(freq - probs) <= tolerance), (freq, probs)


def test_a_rows_draw_depends_on_its_key_only():
  logits = rows(4)
  keys = jax.random.split(jax.random.key(5), logits.shape[0])
  first = np.asarray(call(logits, keys, 1.0)[0])
  shuffled_logits = logits.copy()
  shuffled_logits[1:] = rows(9)[1:]  # other rows change
  other_keys = jnp.concatenate([keys[:1], jax.random.split(jax.random.key(6), 5)])
  again = np.asarray(call(shuffled_logits, other_keys, 1.0)[0])
  assert first[0] == again[0]


def inverse_cdf_float64(logits, uniform, temperature, keep):
  """The draw from the formula, in float64: the first token v with
  Σ_{w ≤ v} q_w > u, q ∝ exp(x / T) over the kept tokens. Also the distance from u to
  the nearest CDF boundary (float32 rounding may flip draws that close)."""
  scaled = logits.astype(np.float64) / temperature[:, None]
  weights = np.where(keep, np.exp(scaled - scaled.max(-1, keepdims=True)), 0.0)
  cdf = np.cumsum(weights, -1) / weights.sum(-1, keepdims=True)
  tokens = np.sum(cdf <= uniform[:, None], -1)
  margin = np.min(np.abs(cdf - uniform[:, None]), -1)
  return tokens, margin


def test_blocked_draw_is_the_float64_inverse_cdf():
  """2000 rows over V = 1000 (25 blocks of 40), half of them top-k 50: the token u picks,
  checked against a float64 inverse CDF written from the formula; every disagreement
  is within float32 rounding of a CDF boundary, and they are rare."""
  batch, vocab = 2000, 1000
  rng = np.random.default_rng(7)
  logits = (rng.standard_normal((batch, vocab)) * 3).astype(np.float32)
  temperature = np.where(np.arange(batch) % 2 == 0, 1.0, 0.7).astype(np.float32)
  top_k = np.where(np.arange(batch) % 4 < 2, 0, 50).astype(np.int32)
  keys = jax.random.split(jax.random.key(11), batch)
  uniform = np.asarray(jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(keys))
  tokens, sampled, model = map(np.asarray, call(logits, keys, temperature, top_k=top_k))
  scaled = logits / temperature[:, None]
  kth = -np.sort(-scaled, -1)[:, 49:50]  # top-k, ties with the k-th value kept
  keep = (scaled >= kth) | (top_k[:, None] == 0)
  expected, margin = inverse_cdf_float64(logits, uniform, temperature, keep)
  differ = tokens != expected
  assert differ.mean() <= 1e-3, differ.sum()
  assert np.all(margin[differ] < 1e-5), margin[differ]
  assert np.all(keep[np.arange(batch), tokens])
  log_softmax = lambda x: x - x.max(-1, keepdims=True) - np.log(
      np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
  rows_ = np.arange(batch)
  model_expected = log_softmax(logits.astype(np.float64))[rows_, tokens]
  scaled = np.where(keep, logits.astype(np.float64) / temperature[:, None], -np.inf)
  sampled_expected = log_softmax(scaled)[rows_, tokens]
  np.testing.assert_allclose(model, model_expected, atol=2e-5)
  np.testing.assert_allclose(sampled, sampled_expected, atol=2e-5)


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.6, 0), (1.3, 5)])
def test_draws_pass_a_chi_square_test(temperature, top_k):
  """20 000 draws over V = 12 (3 blocks of 4): Pearson's χ² against the tempered,
  truncated softmax stays below its 0.999 quantile."""
  scipy_stats = pytest.importorskip("scipy.stats")
  vocab, draws = 12, 20000
  base = np.linspace(-2.0, 1.0, vocab).astype(np.float32)[np.random.default_rng(0).permutation(vocab)]
  keys = jax.random.split(jax.random.key(21), draws)
  tokens = np.asarray(call(np.broadcast_to(base, (draws, vocab)), keys, temperature,
                           top_k=top_k)[0])
  keep = reference_keep(base / temperature, top_k, 1.0, 0.0)
  probs = np.where(keep, np.exp((base - base.max()) / temperature), 0.0)
  probs /= probs.sum()
  counts = np.bincount(tokens, minlength=vocab)
  assert np.all(counts[~keep] == 0)
  expected = draws * probs[keep]
  chi2 = np.sum((counts[keep] - expected) ** 2 / expected)
  assert chi2 < scipy_stats.chi2.ppf(0.999, keep.sum() - 1), (chi2, counts, expected)


def test_the_truncate_variant_draws_the_same_for_rows_that_need_none():
  """truncate=True (some row needs top-k/top-p/min-p) and truncate=False give rows that
  need none the same tokens and log-probs: their keep mask is all true by construction."""
  logits = rows(5, batch=8, vocab=60)
  keys = jax.random.split(jax.random.key(8), 8)
  temperature = jnp.asarray([1.0, 0.5, 0.0, 1.0, 2.0, 1.0, 0.8, 1.0], jnp.float32)
  top_k = jnp.asarray([0, 0, 3, 5, 0, 0, 0, 0], jnp.int32)
  top_p = jnp.asarray([1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0], jnp.float32)
  min_p = jnp.asarray([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0], jnp.float32)
  draw = jax.jit(sample_tokens, static_argnames="truncate")
  both = [np.stack(draw(jnp.asarray(logits), keys, temperature=temperature, top_k=top_k,
                        top_p=top_p, min_p=min_p, truncate=t)) for t in (False, True)]
  plain = np.asarray([0, 1, 2, 4, 7])  # no truncation, or greedy
  np.testing.assert_array_equal(both[0][:, plain], both[1][:, plain])
  assert not np.array_equal(both[0][:, [3, 5, 6]], both[1][:, [3, 5, 6]])


def test_greedy_ties_and_masked_tokens_across_blocks():
  """The first maximal logit wins across blocks (jnp.argmax); tokens at −∞ (a logits
  hook's mask), a whole block of them included, are never drawn."""
  vocab = 36  # 6 blocks of 6
  logits = np.zeros((4, vocab), np.float32)
  logits[:, 20] = logits[:, 31] = 5.0
  logits[:, :6] = -np.inf
  logits[:, 9] = -np.inf
  keys = jax.random.split(jax.random.key(2), 4)
  tokens = np.asarray(call(logits, keys, 0.0)[0])
  np.testing.assert_array_equal(tokens, 20)
  many = 4000
  keys = jax.random.split(jax.random.key(3), many)
  tokens, sampled, model = map(np.asarray, call(np.broadcast_to(logits[0], (many, vocab)),
                                                keys, 3.0))
  assert not np.isin(tokens, [0, 1, 2, 3, 4, 5, 9]).any()
  assert np.all(np.isfinite(sampled)) and np.all(np.isfinite(model))


@pytest.mark.parametrize("fields,expected", [
    ({}, False), ({"top_k": 5}, True), ({"top_p": 0.9}, True), ({"min_p": 0.1}, True),
    ({"top_k": 5, "temperature": 0.0}, False),  # greedy: never truncated
    ({"fire": True, "fire_top_k": 16}, True),  # FIRE's hot draws use fire_top_k
    ({"fire": True, "fire_top_k": 16, "fire_temperature": 0.0}, False),
    ({"fire": False, "fire_top_k": 16}, False)])
def test_needs_truncation_on_the_host(fields, expected):
  """The static flag the engine picks: any draw these parameters make may be truncated
  (cold: top_k / top_p / min_p at T > 0; hot FIRE draws: fire_top_k at T_fire > 0)."""
  values = {**dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, fire=False,
                   fire_temperature=1.0, fire_top_k=0), **fields}
  one = types.SimpleNamespace(**{k: np.asarray(v) for k, v in values.items()})
  assert needs_truncation(one) is expected
  batch = types.SimpleNamespace(**{k: np.stack([np.asarray(v), np.zeros_like(v)])
                                   for k, v in values.items()})
  assert needs_truncation(batch) is expected


def test_a_target_rounded_below_a_block_start_never_picks_a_zero_weight_token():
  """float32 (c + w) − w can exceed c: the residual inside the chosen block is then a hair
  below 0, and the first token of the block (here of zero weight, a −∞ logit) must not be
  taken; nor can a target at the total pick the zero-weight tail."""
  from rlhf_jax.sampling.engine.token_sampling import _first_above
  cumulative = jnp.array([[0.0, 0.5, 1.0, 1.0]])
  positive = jnp.array([[False, True, True, False]])
  assert int(_first_above(cumulative, jnp.array([-1e-8]), positive)[0]) == 1
  assert int(_first_above(cumulative, jnp.array([1.0]), positive)[0]) == 2
  assert int(_first_above(cumulative, jnp.array([0.7]), positive)[0]) == 2
