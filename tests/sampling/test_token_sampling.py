"""Per-row token sampling against NumPy references written from HF's warper order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.sampling import sample_tokens
from rlhf_jax.sampling import truncation_mask


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
