"""Packed rows (models/packing.py): the plan's invariants, and packed forwards equal to
the padded ones (log-probs, entropy, values, gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.algorithms import batch as batch_lib
from rlhf_jax.models import packing

CONFIG = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
P, R = 6, 7


def ragged_batch(seed=0, rows=6):
  rng = np.random.default_rng(seed)
  prompts = [list(rng.integers(3, 64, rng.integers(1, P + 1))) for _ in range(rows)]
  responses = [list(rng.integers(3, 64, rng.integers(1, R + 1))) for _ in range(rows)]
  responses[1] = responses[1][:1]  # a one-token response: its segment is the prompt only
  zeros = [[0.0] * len(r) for r in responses]
  host = batch_lib.build_rollout_batch(prompts, responses, zeros, [0.0] * rows,
                                       [False] * rows, list(range(rows)), prompt_length=P,
                                       response_length=R, pad_id=0)
  prompt_lengths = np.asarray([len(p) for p in prompts])
  return batch_lib.as_device(host), prompt_lengths, np.asarray(host.lengths)


def test_first_fit_decreasing_respects_capacity_and_places_every_item():
  sizes = np.random.default_rng(0).integers(1, 11, 40)
  bins = packing.first_fit_decreasing(sizes, 12)
  assert sorted(i for b in bins for i in b) == list(range(40))
  assert all(sizes[b].sum() <= 12 for b in bins)
  assert len(bins) <= int(np.ceil(11 / 9 * sizes.sum() / 12)) + 1
  with pytest.raises(ValueError, match="row 3 has 13 tokens"):
    packing.first_fit_decreasing(np.array([1, 2, 3, 13]), 12)


def test_split_rows_balances_token_totals():
  sizes = np.random.default_rng(1).integers(1, 100, 64)
  groups = packing.split_rows(sizes, 4)
  totals = [sizes[g].sum() for g in groups]
  assert sorted(i for g in groups for i in g) == list(range(64))
  assert max(totals) <= sizes.sum() / 4 + sizes.max()


def test_the_plan_places_each_real_input_token_once_with_its_position():
  batch, prompt_lengths, lengths = ragged_batch()
  plan = packing.batch_plan(prompt_lengths, lengths, prompt_width=P, response_width=R,
                            bucket=4)
  width = P + R - 1
  assert plan.buffers % 4 == 0
  inputs = np.asarray(batch.attention_mask[:, :-1])
  real = {(b, c) for b, c in zip(*np.nonzero(inputs))}
  placed = [(s // width, s % width) for s in plan.source.ravel() if s >= 0]
  # every real input token but each row's last response token, once
  expected = {(b, c) for b, c in real if c < P - 1 + lengths[b]}
  assert sorted(placed) == sorted(expected)
  for k in range(plan.buffers):  # positions restart at 0 for each segment
    for row in set(plan.segments[k]) - {0}:
      assert list(plan.positions[k][plan.segments[k] == row]) == list(
          range((plan.segments[k] == row).sum()))
  assert np.array_equal((plan.response_index >= 0).sum(1), lengths)


def forward_pair(head, fn):
  model, params = models.init_model(CONFIG, seed=4, head=head)
  batch, prompt_lengths, lengths = ragged_batch(seed=2)
  plan = jax.tree.map(jnp.asarray, packing.batch_plan(
      prompt_lengths, lengths, prompt_width=P, response_width=R, bucket=1))
  assert plan.buffers < batch.tokens.shape[0]  # it did pack
  run = jax.jit(lambda p, b, packed: fn(model, p, b, packed))
  return run(params, batch, None), run(params, batch, plan)


def test_packed_logprobs_and_entropy_equal_the_padded_forward():
  padded, packed = forward_pair("lm", lambda m, p, b, plan: batch_lib.response_logprobs(
      m, p, b, with_entropy=True, packed=plan))
  for got, want in zip(packed, padded):
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_packed_values_equal_the_padded_forward():
  padded, packed = forward_pair("scalar", lambda m, p, b, plan: batch_lib.response_values(
      m, p, b, packed=plan))
  np.testing.assert_allclose(packed, padded, atol=2e-5)


def test_packed_gradients_equal_the_padded_ones():
  def grad(m, p, b, plan):
    chunked = models.with_numerics(m, logprob_chunk=8)
    weights = jnp.linspace(-1.0, 1.0, R)[None, :]
    return jax.grad(lambda q: jnp.sum(weights * batch_lib.response_logprobs(
        chunked, q, b, packed=plan)))(p)

  padded, packed = forward_pair("lm", grad)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-4),
               packed, padded)
