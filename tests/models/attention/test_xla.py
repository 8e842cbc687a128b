"""models/attention/xla.py: grouped_query_attention against jax.nn.dot_product_attention
(values and gradients), soft-capped scores through its hand-written backward against
autodiff of the formula, and the kernels it refuses to dispatch to."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from rlhf_jax.models.attention.cached import cached_attention
from rlhf_jax.models.attention.xla import grouped_query_attention
from tests.models.attention.qkv import inputs


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (6, 1)])
def test_matches_reference_values_and_gradients(heads, kv_heads):
  q, k, v, mask = inputs(0, heads=heads, kv_heads=kv_heads)
  reference = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])
  ours = lambda q, k, v: grouped_query_attention(q, k, v, mask)
  np.testing.assert_allclose(ours(q, k, v), reference(q, k, v), atol=1e-6)
  weights = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)
  # Jitted: op by op, the finite differences ran every op of the forward a dozen times.
  loss = lambda f: jax.jit(lambda q, k, v: jnp.sum(weights * jnp.sin(f(q, k, v))))
  grad = lambda f: jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))
  for ours_grad, ref_grad in zip(grad(ours)(q, k, v), grad(reference)(q, k, v)):
    np.testing.assert_allclose(ours_grad, ref_grad, atol=1e-5)
  check_grads(loss(ours), (q, k, v), order=1, modes=("rev",), eps=1e-3, atol=1e-2, rtol=1e-2)


def test_bfloat16_inputs_stay_close():
  q, k, v, mask = inputs(2)
  full = grouped_query_attention(q, k, v, mask)
  half = grouped_query_attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), mask)
  assert half.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(half, np.float32), full, atol=0.05)


def capped_reference(q, k, v, mask, scale, cap):
  """softmax(cap·tanh(scale·q·kᵀ / cap) + mask)·v written with plain jnp (autodiff)."""
  group = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
  scores = jnp.einsum("btnd,bsnd->bnts", q, k, precision=jax.lax.Precision.HIGHEST) * scale
  scores = cap * jnp.tanh(scores / cap)
  probs = jax.nn.softmax(jnp.where(mask[:, None], scores, -jnp.inf), axis=-1)
  return jnp.einsum("bnts,bsnd->btnd", probs, v, precision=jax.lax.Precision.HIGHEST)


def test_soft_capping_and_a_score_scale_values_and_gradients():
  """Gemma 2's capped scores through the hand-written backward (it recomputes the raw
  scores) against autodiff of the formula; the cap moves the output."""
  q, k, v, mask = inputs(4)
  q = 3 * q  # raw scores of several units, where a cap of 2 bites
  ours = lambda q, k, v: grouped_query_attention(q, k, v, mask, scale=0.3, softcap=2.0)
  reference = lambda q, k, v: capped_reference(q, k, v, mask, 0.3, 2.0)
  np.testing.assert_allclose(ours(q, k, v), reference(q, k, v), atol=1e-5)
  uncapped = grouped_query_attention(q, k, v, mask, scale=0.3)
  assert np.max(np.abs(uncapped - ours(q, k, v))) > 0.1
  weights = jnp.asarray(np.random.default_rng(5).standard_normal(q.shape), jnp.float32)
  loss = lambda f: (lambda q, k, v: jnp.sum(weights * jnp.sin(f(q, k, v))))
  grad = lambda f: jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))
  for ours_grad, ref_grad in zip(grad(ours)(q, k, v), grad(reference)(q, k, v)):
    np.testing.assert_allclose(ours_grad, ref_grad, atol=1e-5)
  keys, values = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
  cached = jax.jit(cached_attention, static_argnames=("scale", "softcap"))
  np.testing.assert_allclose(cached(q, keys, values, mask, scale=0.3, softcap=2.0),
                             reference(q, k, v), atol=1e-5)
  np.testing.assert_allclose(cached(q[:, :1], keys, values, mask[:, :1], scale=0.3,
                                    softcap=2.0), reference(q, k, v)[:, :1], atol=1e-5)


def test_unknown_impl_is_one_line_error():
  q, k, v, mask = inputs(6)
  with pytest.raises(ValueError, match="attention_impl='flash'"):
    grouped_query_attention(q, k, v, mask, impl="flash")
