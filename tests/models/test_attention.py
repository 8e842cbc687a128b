"""grouped_query_attention against jax.nn.dot_product_attention: values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from rlhf_jax.models.attention import choice as kernel_choice
from rlhf_jax.models.attention.cached import _block_lengths
from rlhf_jax.models.attention.cached import cached_attention
from rlhf_jax.models.attention.xla import grouped_query_attention


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


@pytest.mark.parametrize("time,used", [(1, 1), (1, 70), (1, 200), (1, 320), (2, 130), (12, 300)])
def test_cached_attention_reads_the_used_span_exactly(time, used):
  """Decode (few queries) and prefill shapes, any used span: equal to full attention."""
  slots = 320
  q, k, v, mask = inputs(3, batch=3, time=time, slots=slots)
  mask = np.asarray(mask) & (np.arange(slots) < used)
  reference = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask)[:, None])
  keys = k.transpose(0, 2, 3, 1)  # [B, K, D, S]
  values = v.transpose(0, 2, 1, 3)  # [B, K, S, D]
  got = jax.jit(cached_attention)(q, keys, values, jnp.asarray(mask), jnp.int32(used))
  np.testing.assert_allclose(got, reference, atol=1e-5)


@pytest.mark.parametrize("on_gpu", [False, True])
def test_cached_decode_switches_on_the_span_on_cpu_only(monkeypatch, on_gpu):
  """On a GPU a conditional is a host synchronisation per layer: the XLA decode path reads
  every slot there (no `cond` in the program), and the result is the same."""
  monkeypatch.setattr(kernel_choice, "on_gpu", lambda: on_gpu)
  slots, used = 320, 70
  q, k, v, mask = inputs(3, batch=3, time=1, slots=slots)
  mask = np.asarray(mask) & (np.arange(slots) < used)
  keys, values = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
  args = (q, keys, values, jnp.asarray(mask), jnp.int32(used))
  fresh = lambda *a: cached_attention(*a)  # traces are cached per function: a new one
  jaxpr = str(jax.make_jaxpr(fresh)(*args))
  assert ("cond[" in jaxpr) == (not on_gpu), jaxpr
  reference = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask)[:, None])
  np.testing.assert_allclose(jax.jit(fresh)(*args), reference, atol=1e-5)


def test_block_lengths_cover_the_cache():
  assert _block_lengths(320) == [64, 128, 192, 256, 320]
  assert _block_lengths(50) == [50]
  lengths = _block_lengths(4096)
  assert len(lengths) <= 8 and lengths[-1] == 4096 and lengths == sorted(lengths)


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
  for ours_grad, ref_grad in zip(jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v),
                                 jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(ours_grad, ref_grad, atol=1e-5)
  keys, values = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
  cached = jax.jit(cached_attention, static_argnames=("scale", "softcap"))
  np.testing.assert_allclose(cached(q, keys, values, mask, scale=0.3, softcap=2.0),
                             reference(q, k, v), atol=1e-5)
  np.testing.assert_allclose(cached(q[:, :1], keys, values, mask[:, :1], scale=0.3,
                                    softcap=2.0), reference(q, k, v)[:, :1], atol=1e-5)
