"""Q♯'s guide (algorithms/qsharp.py) against NumPy written from the paper's formulas
(arXiv:2502.20548): the bin distribution of every next token, Q̂/η = log Σ_b P(z_b)·exp(z_b/η),
the guided logits log π_ref + Q̂/η over π_ref's top-k, two-hot targets that keep the return,
and the guide's masked cross-entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.algorithms import qsharp

E, V, B = 4, 6, 3
RNG = np.random.default_rng(0)
GUIDE = {"w": RNG.standard_normal((E, V * B)).astype(np.float32),
         "b": RNG.standard_normal(V * B).astype(np.float32)}
VALUES = qsharp.bin_values(B, -1.0, 1.0)


def np_log_softmax(x, axis=-1):
  x = np.asarray(x, np.float64)
  shifted = x - x.max(axis=axis, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def np_bin_log_probs(hidden):
  """[N, V, B]: token a's bins are columns a·B .. a·B + B − 1 of hidden @ w + b."""
  logits = np.asarray(hidden, np.float64) @ GUIDE["w"] + GUIDE["b"]
  return np_log_softmax(logits.reshape(len(hidden), V, B))


def test_bin_values_and_their_errors():
  np.testing.assert_allclose(VALUES, [-1.0, 0.0, 1.0])
  with pytest.raises(ValueError, match="num_bins=1 must be >= 2"):
    qsharp.bin_values(1, 0.0, 1.0)
  with pytest.raises(ValueError, match="high=0.0 > low=0.0"):
    qsharp.bin_values(3, 0.0, 0.0)


def test_a_zero_guide_is_uniform_over_the_bins():
  guide = qsharp.init_guide(E, V, B)
  log_probs = qsharp.bin_log_probs(guide, jnp.ones((2, E)), B)
  np.testing.assert_allclose(log_probs, np.full((2, V, B), -np.log(B)), rtol=1e-6)


def test_q_over_eta_and_the_guided_logits_match_the_formula():
  hidden = RNG.standard_normal((2, E)).astype(np.float32)
  logits = RNG.standard_normal((2, V)).astype(np.float32)
  eta, top_k = 0.5, 3
  log_probs = np_bin_log_probs(hidden)
  np.testing.assert_allclose(jax.jit(lambda h: qsharp.bin_log_probs(GUIDE, h, B))(hidden),
                             log_probs, atol=1e-5)
  q = np.log(np.sum(np.exp(log_probs) * np.exp(VALUES / eta), axis=-1))
  np.testing.assert_allclose(jax.jit(lambda lp: qsharp.soft_q_over_eta(lp, VALUES, eta))(
      jnp.asarray(log_probs, jnp.float32)), q, rtol=1e-5)
  # Jitted: one compile instead of one per primitive (as in every test here).
  guided = np.asarray(jax.jit(lambda h, l: qsharp.guided_logits(
      GUIDE, h, l, values=VALUES, eta=eta, top_k=top_k))(hidden, logits))
  log_ref = np_log_softmax(logits)
  for row in range(2):
    kept = np.argsort(-log_ref[row])[:top_k]
    assert set(np.flatnonzero(np.isfinite(guided[row]))) == set(kept)
    np.testing.assert_allclose(guided[row, kept], log_ref[row, kept] + q[row, kept],
                               rtol=1e-5)


def test_two_hot_targets_keep_the_expected_return():
  returns = jnp.asarray([-2.0, -1.0, -0.25, 0.0, 0.6, 1.0, 3.0])
  targets = np.asarray(jax.jit(lambda r: qsharp.two_hot(r, VALUES))(returns))
  np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=1e-6)
  assert (targets >= 0).all() and ((targets > 0).sum(axis=1) <= 2).all()
  np.testing.assert_allclose(targets @ VALUES, np.clip(returns, -1.0, 1.0), atol=1e-6)


def test_the_guide_loss_is_the_masked_cross_entropy_of_the_taken_tokens():
  hidden = RNG.standard_normal((2, 3, E)).astype(np.float32)
  actions = RNG.integers(0, V, (2, 3))
  returns = np.asarray([0.4, -1.0], np.float32)
  mask = np.asarray([[1, 1, 0], [0, 1, 1]], np.float32)
  loss = jax.jit(lambda guide, *rows: qsharp.guide_loss(guide, *rows, values=VALUES))(
      GUIDE, hidden, actions, returns, mask)
  target = np.asarray(jax.jit(lambda r: qsharp.two_hot(r, VALUES))(returns), np.float64)
  total = 0.0
  for n in range(2):
    log_probs = np_bin_log_probs(hidden[n])  # [T, V, B]
    for t in range(3):
      total += mask[n, t] * -np.sum(target[n] * log_probs[t, actions[n, t]])
  np.testing.assert_allclose(loss, total / mask.sum(), rtol=1e-5)
