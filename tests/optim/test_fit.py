"""The one supervised loop (optim/fit.py) against plain gradient descent written here: the
same losses step by step, the batch of each step, the progress callback; and its default
optimizer (AdamW on a warm-up and cosine schedule) lowering a loss."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax

from rlhf_jax.optim.fit import fit

RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 16, 3)).astype(np.float32)  # one [16, 3] batch per step
W_TRUE = np.array([1.0, -2.0, 0.5], np.float32)


def squared_error(params, batch):
  """Mean squared error of a linear model on one batch."""
  x, y = batch
  return jnp.mean((x @ params["w"] - y) ** 2)


def make_batch(step):
  return X[step % 5], X[step % 5] @ W_TRUE


def test_the_losses_are_those_of_gradient_descent_by_hand():
  seen = []
  result = fit(squared_error, {"w": np.zeros(3, np.float32)}, make_batch, steps=7,
               learning_rate=0.0, optimizer=optax.sgd(0.1),
               progress=lambda step, loss: seen.append((step, loss)))
  w, expected = np.zeros(3), []
  for step in range(7):
    x, y = (np.asarray(a, np.float64) for a in make_batch(step))
    error = x @ w - y
    expected.append(np.mean(error ** 2))
    w = w - 0.1 * 2 * x.T @ error / len(y)
  np.testing.assert_allclose(result.losses, expected, rtol=1e-5)
  np.testing.assert_allclose(result.params["w"], w, rtol=1e-5)
  assert seen == list(enumerate(result.losses)) and result.seconds >= 0


def test_the_default_optimizer_lowers_the_loss():
  result = fit(squared_error, {"w": np.zeros(3, np.float32)}, make_batch, steps=60,
               learning_rate=0.1, warmup_steps=5)
  assert result.losses[-1] < 0.05 * result.losses[0]
