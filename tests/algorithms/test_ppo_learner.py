"""LoRA adapters with an EMA reference (`model.lora_rank > 0`, `algorithm.kl.reference_ema
> 0`): the reference moves toward the merged policy weights, in the plain model's layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.algorithms.ppo_learner import PPOLearner
from rlhf_jax.models import lora as lora_lib
from tests.training.runs import preset


def lora_ema_config(rate):
  """GRPO with a KL loss, LoRA adapters of rank 2 and an EMA reference of rate `rate`."""
  c = preset("grpo")
  c.model.lora_rank, c.model.lora_alpha = 2, 4.0
  c.algorithm.kl.reference_ema = rate
  c.optimizer.learning_rate, c.optimizer.warmup_steps = 5e-2, 1
  c.train.minibatches = 1
  return c


def sampled_batch(model, params, rows=8, prompt=3, response=5, seed=0):
  """Random prompts and responses whose old/sampler log-probs are the model's own."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, response + 1, rows)
  batch = batch_lib.build_rollout_batch(
      [list(rng.integers(1, 32, prompt)) for _ in range(rows)],
      [list(rng.integers(1, 32, n)) for n in lengths], [[0.0] * n for n in lengths],
      list(rng.choice([-1.0, 1.0], rows)), [False] * rows, [0] * rows,
      prompt_length=prompt, response_length=response, pad_id=0)
  batch = batch_lib.as_device(batch)
  own = batch_lib.response_logprobs(model, params, batch)
  return batch.replace(old_logprobs=own, sampler_logprobs=own)


@pytest.mark.slow
def test_an_ema_reference_follows_the_merged_lora_policy():
  """Two updates of a LoRA policy with reference_ema η: after each, the reference equals
  (1 − η)·reference + η·merged(adapters, base), computed here directly (it raised a
  pytree-structure error after the first update: the {adapters, base} tree fed the EMA)."""
  rate = 0.25
  c = lora_ema_config(rate)
  config = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, intermediate_size=24)
  model, params = models.init_model(config, seed=0)
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  learner = PPOLearner.from_config(c, model, params, mesh)
  assert set(learner.actor.params) == {"adapters", "base"}
  lora = learner.actor.model.lora
  for step in range(2):
    reference = jax.tree.map(np.asarray, learner.reference.params)
    batch = sampled_batch(model, learner.policy_params, seed=step)
    batch = batch.replace(token_versions=jnp.full_like(batch.token_versions, step))
    learner.learn(batch, step=step)
    adapters = jax.tree.map(np.asarray, learner.actor.params["adapters"])
    base = jax.tree.map(np.asarray, learner.actor.params["base"])
    merged = lora_lib.merge(base, adapters, lora)
    expected = jax.tree.map(lambda r, m: (1 - rate) * r + rate * np.asarray(m),
                            reference, merged)
    assert jax.tree.structure(learner.reference.params) == jax.tree.structure(expected)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6,
                                                              atol=1e-7),
                 learner.reference.params, expected)
    # The adapters moved, so the reference is no longer the base alone.
    assert not all(np.array_equal(np.asarray(a), b) for a, b in zip(
        jax.tree.leaves(learner.reference.params), jax.tree.leaves(reference)))
