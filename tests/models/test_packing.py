"""Packed rows (models/packing.py): the plan's invariants, and packed forwards equal to
the padded ones (log-probs, entropy, values, gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax import batch as batch_lib
from rlhf_jax.models import packing

CONFIG = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
P, R = 6, 7


def ragged_batch(seed=0, rows=6):
  rng = np.random.default_rng(seed)
  prompts = [list(rng.integers(3, 64, rng.integers(1, P + 1))) for _ in range(rows)]
  responses = [list(rng.integers(3, 64, rng.integers(1, R + 1))) for _ in range(rows)]
  responses[1] = responses[1][:1]  # a one-token response
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


def test_the_plan_places_each_real_token_once_with_its_position():
  batch, prompt_lengths, lengths = ragged_batch()
  plan = packing.batch_plan(prompt_lengths, lengths, prompt_width=P, response_width=R)
  width = P + R
  assert plan.source.shape[1] == 16  # P + R = 13 rounded up to a power of two
  real = {(b, c) for b, c in zip(*np.nonzero(np.asarray(batch.attention_mask)))}
  placed = [(s // width, s % width) for s in plan.source.ravel() if s >= 0]
  # every real token of the whole rows (the last response token too), once
  assert sorted(placed) == sorted(real)
  for k in range(plan.buffers):  # positions restart at 0 for each segment
    for row in set(plan.segments[k]) - {0}:
      assert list(plan.positions[k][plan.segments[k] == row]) == list(
          range((plan.segments[k] == row).sum()))
  assert np.array_equal((plan.response_index >= 0).sum(1), lengths)
  # response token t of a row is predicted by the state of its column P - 1 + t
  flat = plan.source.ravel()
  for row in range(len(lengths)):
    columns = flat[plan.response_index[row, :lengths[row]]] - row * width
    assert list(columns) == list(range(P - 1, P - 1 + lengths[row]))


@pytest.mark.parametrize("width,capacity", [(2, 2), (13, 16), (64, 64), (65, 128),
                                            (128, 128), (129, 256), (1023, 1024),
                                            (1024, 1024), (1025, 1152), (1536, 1536)])
def test_buffers_hold_whole_rows_rounded_up_to_the_alignment(width, capacity):
  assert packing.PACK_ALIGN == 128
  assert packing.buffer_capacity(width) == capacity


def test_buckets_are_eighths_of_the_count_that_always_suffices():
  assert packing.buffer_buckets(64) == (8, 16, 24, 32, 40, 48, 56, 64)
  assert packing.buffer_buckets(10) == (2, 4, 6, 8, 10)
  assert packing.buffer_buckets(2) == (1, 2)
  assert packing.buffer_buckets(1) == (1,)
  for most in range(1, 70):
    buckets = packing.buffer_buckets(most)
    assert len(buckets) <= 8 and max(buckets) == most
    for needed in range(1, most + 1):
      count = packing.bucketed(needed, most)
      assert count in buckets and needed <= count < needed + -(-most // 8)
  assert packing.bucketed(11, 4) == 12  # above N: multiples of N


def test_a_buffer_holds_at_most_the_rows_a_packed_description_can():
  sizes = np.ones(100, np.int64)
  bins = packing.first_fit_decreasing(sizes, 1024)
  assert max(len(b) for b in bins) == packing.MAX_ROWS_PER_BUFFER == 32
  assert sorted(i for b in bins for i in b) == list(range(100))
  assert len(bins) == 4 == packing.most_buffers(100, 2, 1024)


def test_the_buffers_that_always_suffice_do():
  rng = np.random.default_rng(3)
  for _ in range(200):
    width = int(rng.integers(1, 300))
    capacity = packing.buffer_capacity(width)
    sizes = rng.integers(1, width + 1, int(rng.integers(1, 40)))
    bins = packing.first_fit_decreasing(sizes, capacity)
    assert len(bins) <= packing.most_buffers(len(sizes), width, capacity)


def test_a_batch_plan_compiles_at_most_eight_buffer_counts():
  """Whatever the lengths, 16 rows of P + R = 13 tokens (one a 16-token buffer) take an
  even number of buffers (eighths of 16)."""
  rng = np.random.default_rng(5)
  counts = set()
  for _ in range(300):
    top = rng.integers(1, R + 1)
    prompts, responses = rng.integers(1, P + 1, 16), rng.integers(0, top + 1, 16)
    counts.add(packing.batch_plan(prompts, responses, prompt_width=P,
                                  response_width=R).buffers)
  assert counts <= set(packing.buffer_buckets(16)) == {2, 4, 6, 8, 10, 12, 14, 16}


def forward_pair(head, fn):
  model, params = models.init_model(CONFIG, seed=4, head=head)
  batch, prompt_lengths, lengths = ragged_batch(seed=2)
  plan = jax.tree.map(jnp.asarray, packing.batch_plan(
      prompt_lengths, lengths, prompt_width=P, response_width=R))
  assert max(len(set(row) - {0}) for row in np.asarray(plan.segments)) >= 2  # it did pack
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


def old_packed_forward(model, params, batch, prompt_lengths, lengths, head):
  """The packed forward as it was before even lengths, written from `DecoderLM.__call__`:
  each row's span [P − p, P − 1 + r) of `tokens[:, :-1]` laid end to end (next fit) in
  buffers of P + R − 1 tokens; log-probs and entropy, or values, of the response tokens."""
  width, rows = P + R - 1, len(lengths)
  inputs = np.asarray(batch.tokens)[:, :-1]
  buffers, index = [[]], np.zeros((rows, R), np.int64)
  for row in range(rows):
    start, end = P - prompt_lengths[row], P - 1 + lengths[row]
    if len(buffers[-1]) + end - start > width:
      buffers.append([])
    base = (len(buffers) - 1) * width + len(buffers[-1]) + P - 1 - start
    index[row, :lengths[row]] = base + np.arange(lengths[row])
    buffers[-1] += [(inputs[row, c], c - start, row + 1) for c in range(start, end)]
  laid = np.zeros((len(buffers), width, 3), np.int32)
  for k, members in enumerate(buffers):
    laid[k, :len(members)] = members
  tokens, positions, segments = (jnp.asarray(laid[..., i]) for i in range(3))
  out, _ = model.apply(params, tokens, positions=positions, segment_ids=segments,
                       attention_mask=segments > 0)
  picked = out.reshape(-1, *out.shape[2:])[index]
  if head == "scalar":
    return picked * batch.response_mask
  targets = batch.tokens[:, -R:]
  return (kernels.token_logprobs(picked, targets) * batch.response_mask,
          kernels.entropy_from_logits(picked) * batch.response_mask)


@pytest.mark.parametrize("head", ["lm", "scalar"])
def test_aligned_packed_forward_equals_the_old_packed_one_and_so_do_its_gradients(head):
  """Buffers of whole rows (16 tokens) against the old ones (P + R − 1 = 12 tokens):
  the same log-probs, entropy, values and parameter gradients in float32."""
  model, params = models.init_model(CONFIG, seed=6, head=head)
  batch, prompt_lengths, lengths = ragged_batch(seed=3)
  plan = jax.tree.map(jnp.asarray, packing.batch_plan(
      prompt_lengths, lengths, prompt_width=P, response_width=R))
  assert plan.source.shape[1] == 16
  weights = jnp.asarray(np.random.default_rng(7).normal(size=(len(lengths), R)), jnp.float32)

  def new(p):
    if head == "scalar":
      return batch_lib.response_values(model, p, batch, packed=plan)
    return batch_lib.response_logprobs(model, p, batch, with_entropy=True, packed=plan)

  def loss(forward, p):
    out = forward(p)
    outs = (out,) if head == "scalar" else out
    return sum(jnp.sum(weights * x) * (i + 1) for i, x in enumerate(outs)), out

  old = lambda p: old_packed_forward(model, p, batch, prompt_lengths, lengths, head)
  (_, want), want_grad = jax.jit(jax.value_and_grad(lambda p: loss(old, p), has_aux=True))(params)
  (_, got), got_grad = jax.jit(jax.value_and_grad(lambda p: loss(new, p), has_aux=True))(params)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6), got, want)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6),
               got_grad, want_grad)
