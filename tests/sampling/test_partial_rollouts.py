"""Partial rollouts end to end: a `swap_now` scheduler swaps weights mid-sample, and the
tokens it draws after the swap (over the KV cache the old weights computed) are handled
as stale by decoupled PPO, like the tokens before it: π_old = the trainer's π_prox and
w = min(π_prox / π_behav, cap) (`RolloutBatch.stale_mask`). A sample drawn wholly by the
new weights stays fresh: π_old the sampler's, w = 1 exactly."""

import jax.numpy as jnp
import numpy as np

from rlhf_jax import batch as batch_lib
from rlhf_jax import models
from rlhf_jax import sampling
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.sampling.scheduler import Scheduler

CONFIG = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                              num_kv_heads=1, head_dim=8, intermediate_size=24)
PROMPT = [3, 5, 7, 9]
NEW_TOKENS = 8


def test_tokens_after_a_mid_sample_swap_are_stale():
  model, old = models.init_model(CONFIG, seed=0)
  _, new = models.init_model(CONFIG, seed=1)
  engine = sampling.Engine(model, num_slots=2, cache_length=16)
  sched = Scheduler(engine, old, prompt_buckets=(8,), steps_per_sync=2,
                    update_policy="swap_now")
  params = sampling.SamplingParams(max_new_tokens=NEW_TOKENS, seed=0, stop_token_ids=())
  partial = sched.submit(PROMPT, params)
  sched.step()
  sched.update_params(new, version=1)
  whole = sched.submit(PROMPT, params)
  done = {c.request_id: c for c in sched.run()}
  rows = [done[partial], done[whole]]
  assert rows[0].token_versions == [0] * 3 + [1] * 5  # swapped mid-sample
  assert rows[1].token_versions == [1] * NEW_TOKENS

  batch = batch_lib.build_rollout_batch(
      [PROMPT] * 2, [r.token_ids for r in rows], [r.model_logprobs for r in rows],
      [1.0, -1.0], [False, False], [0, 0], prompt_length=8, response_length=NEW_TOKENS,
      pad_id=0, token_versions=[r.token_versions for r in rows])
  batch = batch_lib.as_device(batch)
  trainer = np.asarray(batch_lib.response_logprobs(model, new, batch))  # π_prox
  a = ppo_config.algorithm_config()
  a.staleness.mode, a.staleness.cap = "tis", 5.0
  prepared, _, metrics = ppo_family.prepare(
      a, batch, old_logprobs=jnp.asarray(trainer), ref_logprobs=None, values=None,
      kl_coef=jnp.float32(0.0), correction="none", group_size=2, version=1)
  sampler = np.asarray(batch.sampler_logprobs)
  old_logprobs, weights = np.asarray(prepared.old_logprobs), np.asarray(prepared.is_weights)
  # The partial row: every token, the ones drawn after the swap included, is stale.
  np.testing.assert_allclose(old_logprobs[0], trainer[0], rtol=1e-6)
  np.testing.assert_allclose(weights[0], np.minimum(np.exp(trainer[0] - sampler[0]), 5.0),
                             rtol=1e-5)
  after_swap = slice(3, NEW_TOKENS)
  # The old weights' KV cache shows: the sampler's log-probs after the swap are not the
  # new policy's (so w = 1 and π_old = π_behav would be wrong for them).
  assert np.max(np.abs(trainer[0, after_swap] - sampler[0, after_swap])) > 1e-3
  # The row drawn wholly by the new weights: plain PPO.
  np.testing.assert_array_equal(old_logprobs[1], sampler[1])
  np.testing.assert_array_equal(weights[1], np.ones(NEW_TOKENS, np.float32))
  np.testing.assert_allclose(trainer[1], sampler[1], atol=1e-5)
  assert float(metrics["staleness/stale_token_fraction"]) == 0.5
  assert float(metrics["staleness/mixed_version_row_fraction"]) == 0.5
