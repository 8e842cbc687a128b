"""models/attention/cached.py: attention over a KV cache as stored, for decode and prefill
shapes and any used span, against jax.nn.dot_product_attention on the same keys; the
decode path's span switch (CPU only) and the spans it may read."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.models.attention import choice as kernel_choice
from rlhf_jax.models.attention.cached import _block_lengths
from rlhf_jax.models.attention.cached import cached_attention
from tests.models.attention.qkv import inputs


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
