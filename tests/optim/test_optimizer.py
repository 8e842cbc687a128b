"""The optimizer's learning-rate schedule (optim/optimizer.py) against its formula: linear
warm-up, then constant or cosine decay to a final fraction."""

import numpy as np

from rlhf_jax import optim


def test_learning_rate_schedule_follows_warmup_then_cosine():
  def reference(k, lr=2.0, warmup=4, total=20, final=0.1):
    rate = lr * min(1.0, (k + 1) / warmup)
    progress = min(max((k + 1 - warmup) / (total - warmup), 0.0), 1.0)
    return rate * (final + (1 - final) * 0.5 * (1 + np.cos(np.pi * progress)))

  cosine = optim.rl_schedule(2.0, 4, decay_updates=20, final_fraction=0.1)
  constant = optim.rl_schedule(2.0, 4)
  for k in range(25):
    np.testing.assert_allclose(float(cosine(k)), reference(k), rtol=1e-6)
    np.testing.assert_allclose(float(constant(k)), 2.0 * min(1.0, (k + 1) / 4), rtol=1e-6)
  assert float(cosine(3)) == 2.0 and abs(float(cosine(19)) - 0.2) < 1e-6
