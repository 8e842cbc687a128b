"""DQO's learner (algorithms/dqo_learner.py) on a tiny model, one step from the config: with a
cached reference the batch's sampler log-probs are π_ref and μ, so the step's KL and traces
are those of the policy's own forward against them (NumPy here); then the value head and
the policy both move."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax import parallel
from rlhf_jax.algorithms.dqo_learner import DQOLearner
from rlhf_jax.training.config import sibling_preset
from tests.algorithms.actors import tiny_model


@pytest.mark.slow
def test_one_step_reads_the_cached_reference_and_moves_both_roles():
  c = sibling_preset("configs/dqo.py", "dqo", "arith")
  c.train.minibatches, c.train.micro_batches, c.train.epochs = 1, 1, 1
  c.algorithm.dqo.trace_clip = 1.0
  model, params = tiny_model()
  rng = np.random.default_rng(0)
  lengths = rng.integers(2, 6, 4)
  batch = batch_lib.as_device(batch_lib.build_rollout_batch(
      [[3, 4]] * 4, [list(rng.integers(1, 32, n)) for n in lengths],
      [list(-rng.uniform(2.5, 4.5, n)) for n in lengths], [1.0, 0.0, 1.0, 0.0], [False] * 4,
      [0, 0, 1, 1], prompt_length=2, response_length=5, pad_id=0))
  mask = np.asarray(batch.response_mask, np.float64)
  logprobs = np.asarray(batch_lib.response_logprobs(model, params, batch), np.float64)
  ref = np.asarray(batch.sampler_logprobs, np.float64)
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  learner = DQOLearner.from_config(c, model, jax.tree.map(lambda x: x.copy(), params), mesh)
  assert learner.reference is None  # cached: the trainer holds no reference copy
  critic_before = jax.tree.map(np.asarray, learner.critic.params)
  out = jax.device_get(learner.learn(batch, step=0))
  prepared = out["prepare"]
  np.testing.assert_allclose(prepared["dqo/kl_k1"], np.sum((logprobs - ref) * mask) / 4,
                             rtol=1e-4)
  traces = np.minimum(np.exp(logprobs - ref), 1.0) * mask
  np.testing.assert_allclose(prepared["dqo/trace_mean"], traces.sum() / mask.sum(), rtol=1e-4)
  assert np.isfinite(out["critic"]["loss"]).all() and np.isfinite(out["actor"]["loss"]).all()
  moved = lambda a, b: not all(np.array_equal(x, np.asarray(y)) for x, y in
                               zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert moved(critic_before, learner.critic.params)
  assert moved(params, learner.actor.params)
