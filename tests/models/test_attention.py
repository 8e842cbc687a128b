"""grouped_query_attention against jax.nn.dot_product_attention: values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from rlhf_jax.models.attention import grouped_query_attention


def inputs(seed, batch=2, time=5, slots=7, heads=4, kv_heads=2, dim=8):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((batch, time, heads, dim)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((batch, slots, kv_heads, dim)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((batch, slots, kv_heads, dim)), jnp.float32)
  mask = rng.random((batch, time, slots)) < 0.6
  mask[..., 0] = True  # every query sees at least one key
  return q, k, v, jnp.asarray(mask)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (6, 1)])
def test_matches_reference_values_and_gradients(heads, kv_heads):
  q, k, v, mask = inputs(0, heads=heads, kv_heads=kv_heads)
  reference = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])
  ours = lambda q, k, v: grouped_query_attention(q, k, v, mask)
  np.testing.assert_allclose(ours(q, k, v), reference(q, k, v), atol=1e-6)
  weights = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)
  loss = lambda f: (lambda q, k, v: jnp.sum(weights * jnp.sin(f(q, k, v))))
  for ours_grad, ref_grad in zip(jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v),
                                 jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(ours_grad, ref_grad, atol=1e-5)
  check_grads(loss(ours), (q, k, v), order=1, modes=("rev",), eps=1e-3, atol=1e-2, rtol=1e-2)


def test_bfloat16_inputs_stay_close():
  q, k, v, mask = inputs(2)
  full = grouped_query_attention(q, k, v, mask)
  half = grouped_query_attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), mask)
  assert half.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(half, np.float32), full, atol=0.05)
