"""Attention sinks (gpt-oss: a learned logit per query head that joins the softmax's
denominator and attends to nothing) in every attention kernel: the XLA attention and its
hand-written backward, the Pallas flash kernel (interpret mode), the cached prefill and
decode paths, the ragged Pallas decode kernel; values against a NumPy softmax-with-sink
written from the formula, gradients against NumPy central differences of it. cuDNN has
no sinks: "auto" routes around it and asking for it is refused in one line."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.models.attention import choice as kernel_choice
from rlhf_jax.models.attention import cudnn as cudnn_attention
from rlhf_jax.models.attention.cached import cached_attention
from rlhf_jax.models.attention.pallas_decode import decode_attention
from rlhf_jax.models.attention.xla import grouped_query_attention
from rlhf_jax.models.blocks import attention_mask

# One left-padded row, one packed row of two segments; G = 2. D = 16: Triton's smallest dot.
B, T, N, K, D = 2, 6, 4, 2, 16
TOKEN_MASK = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], bool)
SEGMENTS = np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]], np.int32)


def tolerance(impl: str, cpu: float) -> float:
  """`cpu` off a GPU; on one (scripts/gpu_check.sh runs this file there) the Triton kernels'
  float32 dots are TF32, ~1e-3 relative."""
  return cpu if impl == "xla" or jax.default_backend() != "gpu" else 1e-2


def reference(q, k, v, allowed, sinks):
  """o[b,t,n] = Σ_s e^(x_s) v_s / (Σ_s e^(x_s) + e^(z_n)), x = q·k/√D over the allowed
  keys, in float64. q [B,T,N,D], k and v [B,S,K,D], allowed [B,T,S], sinks [N]."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  group = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # query head n: KV n // G
  scores = np.einsum("btnd,bsnd->btns", q, k) / np.sqrt(q.shape[3])
  scores = np.where(np.asarray(allowed)[:, :, None, :], scores, -np.inf)
  top = np.maximum(scores.max(axis=-1), sinks)  # [B, T, N]
  weights = np.exp(scores - top[..., None])
  total = weights.sum(axis=-1) + np.exp(sinks - top)
  return np.einsum("btns,bsnd->btnd", weights, v) / total[..., None]


def numeric_grads(loss, arrays, eps=1e-5):
  """Central differences of a float64 scalar function of a list of arrays."""
  grads = []
  for i, array in enumerate(arrays):
    grad = np.zeros(array.shape)
    for index in np.ndindex(array.shape):
      shifted = [a.copy() for a in arrays]
      shifted[i][index] += eps
      up = loss(*shifted)
      shifted[i][index] -= 2 * eps
      grad[index] = (up - loss(*shifted)) / (2 * eps)
    grads.append(grad)
  return grads


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((B, T, N, D))
  k, v = rng.standard_normal((2, B, T, K, D))
  sinks = rng.standard_normal(N) * 1.5
  cotangent = rng.standard_normal((B, T, N, D)) * TOKEN_MASK[:, :, None, None]
  return q, k, v, sinks, cotangent


def _allowed():
  slots = jnp.broadcast_to(jnp.arange(T), (B, T))
  return attention_mask(slots, jnp.asarray(TOKEN_MASK), jnp.asarray(SEGMENTS), None)


@functools.partial(jax.jit, static_argnames="impl")
def _value_and_grads(q, k, v, sinks, cotangent, impl):
  def loss(q, k, v, sinks):
    out = grouped_query_attention(q, k, v, _allowed(), impl=impl,
                                  token_mask=jnp.asarray(TOKEN_MASK),
                                  segment_ids=jnp.asarray(SEGMENTS), sinks=sinks,
                                  precision=jax.lax.Precision.HIGHEST)
    return jnp.sum(out * cotangent), out
  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
      q, k, v, sinks)
  return out, grads


@pytest.fixture(scope="module")
def expected():
  """The reference's output and gradients (q, k, v, sinks) of Σ out·cotangent."""
  q, k, v, sinks, cotangent = _inputs()
  allowed = np.asarray(_allowed())
  loss = lambda *arrays: float(np.sum(reference(*arrays[:3], allowed, arrays[3]) * cotangent))
  return reference(q, k, v, allowed, sinks), numeric_grads(loss, [q, k, v, sinks])


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_training_kernels_equal_the_softmax_with_sink_values_and_gradients(impl, expected):
  q, k, v, sinks, cotangent = (jnp.asarray(a, jnp.float32) for a in _inputs())
  out, grads = _value_and_grads(q, k, v, sinks, cotangent, impl)
  want_out, want_grads = expected
  real = TOKEN_MASK[:, :, None, None]
  np.testing.assert_allclose(np.where(real, out, 0), np.where(real, want_out, 0),
                             atol=tolerance(impl, 2e-5))
  for name, got, want in zip(("dq", "dk", "dv", "dsinks"), grads, want_grads):
    np.testing.assert_allclose(got, want, atol=tolerance(impl, 2e-4), err_msg=name)
  # The sinks matter: without them every row sums its values' weights to one.
  plain = grouped_query_attention(q, k, v, _allowed(), token_mask=jnp.asarray(TOKEN_MASK))
  assert np.max(np.abs(np.where(real, plain - out, 0))) > 1e-2


def test_a_sink_far_below_the_scores_is_plain_attention():
  q, k, v, _, _ = (jnp.asarray(a, jnp.float32) for a in _inputs())
  allowed = _allowed()
  sunk = grouped_query_attention(q, k, v, allowed, sinks=jnp.full((N,), -1e4))
  np.testing.assert_allclose(sunk, grouped_query_attention(q, k, v, allowed), atol=1e-6)


@pytest.mark.parametrize("kernel", ["xla", "pallas"])
def test_cached_decode_and_prefill_equal_the_reference(kernel):
  """A cache of 16 slots: row 0 left-padded, row 1 with a hole; a prefill of 3 queries
  (XLA) and a one-query step (the chosen kernel) over the stored layouts."""
  rng = np.random.default_rng(1)
  slots = 16
  keys, values = rng.standard_normal((2, B, slots, K, D))
  valid = np.ones((B, slots), bool)
  valid[0, :5] = valid[1, 3] = False
  sinks = rng.standard_normal(N)
  stored_keys = jnp.asarray(keys.transpose(0, 2, 3, 1), jnp.float32)  # [B, K, D, S]
  stored_values = jnp.asarray(values.transpose(0, 2, 1, 3), jnp.float32)  # [B, K, S, D]
  for queries in (1, 3):
    q = rng.standard_normal((B, queries, N, D))
    query_slots = np.arange(slots - queries, slots)
    allowed = valid[:, None, :] & (np.arange(slots)[None, None, :] <= query_slots[None, :, None])
    out = jax.jit(cached_attention, static_argnames="kernel")(
        jnp.asarray(q, jnp.float32), stored_keys, stored_values, jnp.asarray(allowed),
        kernel=kernel, sinks=jnp.asarray(sinks, jnp.float32))
    np.testing.assert_allclose(out, reference(q, keys, values, allowed, sinks),
                               atol=tolerance(kernel, 2e-5))


def test_pallas_decode_kernel_with_splits_equals_the_reference():
  """Several splits per row: the sink joins the log-sum-exp combine once, not per split."""
  rng = np.random.default_rng(2)
  slots = 64
  keys, values = rng.standard_normal((2, B, slots, K, D))
  valid = np.ones((B, slots), bool)
  valid[0, :5] = False
  sinks = rng.standard_normal(N) + 2.0
  q = rng.standard_normal((B, N, D))
  out = decode_attention(jnp.asarray(q, jnp.float32),
                         jnp.asarray(keys.transpose(0, 2, 3, 1), jnp.float32),
                         jnp.asarray(values.transpose(0, 2, 1, 3), jnp.float32),
                         jnp.asarray(valid), block_size=16, num_splits=4,
                         sinks=jnp.asarray(sinks, jnp.float32))
  want = reference(q[:, None], keys, values, valid[:, None], sinks)[:, 0]
  np.testing.assert_allclose(out, want, atol=2e-5)


def test_cudnn_is_never_chosen_for_sinks_and_refuses_them(monkeypatch):
  assert "sinks" in cudnn_attention.refusal(jnp.bfloat16, 64, 128, sinks=True)
  assert cudnn_attention.refusal(jnp.bfloat16, 64, 128) is None
  monkeypatch.setattr(kernel_choice, "_on_nvidia_gpu", lambda: True)
  monkeypatch.setattr(kernel_choice, "_cudnn_hopper", lambda: True)
  pick = functools.partial(kernel_choice.training_attention, "auto", dtype=jnp.bfloat16,
                           head_dim=64, time=128)
  assert pick() == "cudnn" and pick(sinks=True) == "pallas"
  q, k, v, sinks, _ = (jnp.asarray(a, jnp.float32) for a in _inputs())
  with pytest.raises(ValueError, match="^attention_impl='cudnn' cannot compute attention "
                     "sinks"):
    grouped_query_attention(q, k, v, _allowed(), impl="cudnn", sinks=sinks)
