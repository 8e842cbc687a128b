"""DecoderConfig.matmul_precision reaches every dot_general of the model: forward,
autodiff backward (incl. the hand-written attention VJP), remat, and the cached path.
(The field's values and its `precision` property: test_decoder_config.py.)"""

from __future__ import annotations

import jax
from jax.extend import core as jex_core
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.models import DecoderConfig
from rlhf_jax.models import KVCache
from rlhf_jax.models import init_model
from rlhf_jax.models.attention.xla import grouped_query_attention

HIGHEST = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
BACKEND_DEFAULT = (None, (jax.lax.Precision.DEFAULT, jax.lax.Precision.DEFAULT))


@pytest.fixture(autouse=True)
def _no_process_wide_precision():
  """These tests read the precision the model writes into its jaxprs; a process-wide
  `JAX_DEFAULT_MATMUL_PRECISION` (the GPU check sets `highest`) would be written there too."""
  with jax.default_matmul_precision(None):
    yield


def tiny_config(**changes) -> DecoderConfig:
  config = DecoderConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                         num_kv_heads=2, head_dim=8, intermediate_size=48,
                         max_position_embeddings=256)
  return config.replace(**changes)


def _sub_jaxprs(value):
  if isinstance(value, jex_core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, jex_core.Jaxpr):
    yield value
  elif isinstance(value, (list, tuple)):
    for item in value:
      yield from _sub_jaxprs(item)


def dot_generals(jaxpr, path=()):
  """(path, eqn) for every dot_general in `jaxpr` and, recursively, its sub-jaxprs
  (pjit, custom_vjp_call / custom_jvp_call, remat, scan, cond / switch branches...)."""
  if isinstance(jaxpr, jex_core.ClosedJaxpr):
    jaxpr = jaxpr.jaxpr
  for eqn in jaxpr.eqns:
    where = path + (eqn.primitive.name,)
    if eqn.primitive.name == "dot_general":
      yield where, eqn
    for value in eqn.params.values():
      for sub in _sub_jaxprs(value):
        yield from dot_generals(sub, where)


def tokens_and_mask(batch=2, time=16):
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 64, (batch, time)), jnp.int32)
  mask = jnp.asarray(np.arange(time)[None, :] < np.array([[time], [time - 5]]))
  return tokens, mask


def forward_jaxpr(config, head="lm"):
  # The jaxprs are traced from abstract parameters: nothing is initialised or run.
  model, params = init_model(config, head=head, abstract=True)
  tokens, mask = tokens_and_mask()
  return jax.make_jaxpr(
      lambda p: model.apply(p, tokens, attention_mask=mask)[0])(params)


def grad_jaxpr(config, head="lm"):
  model, params = init_model(config, head=head, abstract=True)
  tokens, mask = tokens_and_mask()

  def loss(p):
    out = model.apply(p, tokens, attention_mask=mask)[0].astype(jnp.float32)
    return jnp.sum(jnp.sin(out))

  return jax.make_jaxpr(jax.grad(loss))(params)


def cached_jaxpr(config):
  """A sampler-style prefill into a KVCache (as sampling/engine/engine.py does), then a decode step."""
  model, params = init_model(config, abstract=True)
  tokens, mask = tokens_and_mask()
  true_length = jnp.sum(mask, axis=1, dtype=jnp.int32)

  def prefill_and_decode(p):
    cache = KVCache.create(model.config, tokens.shape[0], 128)
    logits, cache = model.apply(p, tokens, attention_mask=mask, cache=cache,
                                head_positions=true_length - 1)
    next_tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    step_logits, cache = model.apply(p, next_tokens[:, None], cache=cache,
                                     head_positions=jnp.zeros_like(next_tokens))
    return logits, step_logits, cache

  return jax.make_jaxpr(prefill_and_decode)(params)


def precisions(jaxpr) -> list:
  """The `precision` param of every dot_general (at least one must exist)."""
  found = [eqn.params["precision"] for _, eqn in dot_generals(jaxpr)]
  assert found, "no dot_general found"
  return found


def attention_dots(jaxpr) -> list:
  """The attention einsums: the only dots with batch dimensions ([B, K] batched);
  every projection and head is a 2-D GEMM without any."""
  return [eqn for _, eqn in dot_generals(jaxpr)
          if eqn.params["dimension_numbers"][1][0]]


# ----------------------------------------------------------------------------- jaxprs


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("tie", [False, True])
def test_float32_auto_is_highest_everywhere(remat, tie):
  config = tiny_config(remat=remat, tie_embeddings=tie)
  forward = forward_jaxpr(config)
  assert set(precisions(forward)) == {HIGHEST}
  assert len(attention_dots(forward)) == 2  # scores, probs·V
  backward = grad_jaxpr(config)
  assert set(precisions(backward)) == {HIGHEST}
  # Forward 2 + the hand-written backward's d_v, d_probs, d_q, d_k (all at HIGHEST).
  assert len(attention_dots(backward)) >= 6
  if remat:
    assert any("remat" in "".join(where) or "checkpoint" in "".join(where)
               for where, _ in dot_generals(backward))


def test_attention_backward_takes_the_precision():
  q = jnp.ones((2, 16, 4, 8), jnp.float32)
  kv = jnp.ones((2, 16, 2, 8), jnp.float32)
  allowed = jnp.tril(jnp.ones((16, 16), bool))[None].repeat(2, 0)
  for precision, expected in ((jax.lax.Precision.HIGHEST, {HIGHEST}), (None, {None})):
    attend = lambda q, k, v, p=precision: jnp.sum(
        grouped_query_attention(q, k, v, allowed, precision=p) ** 2)
    jaxpr = jax.make_jaxpr(jax.grad(attend, argnums=(0, 1, 2)))(q, kv, kv)
    assert len(precisions(jaxpr)) == 6
    assert set(precisions(jaxpr)) == expected


def test_float32_auto_cached_path_is_highest():
  jaxpr = cached_jaxpr(tiny_config())
  assert set(precisions(jaxpr)) == {HIGHEST}
  assert len(attention_dots(jaxpr)) == 2  # prefill attention (the decode read has no dot)
  # 4 GEMMs a layer (q/k/v fused, o, gate/up fused, down) + LM head, prefill and decode
  assert len(precisions(jaxpr)) == 2 * (4 + 1) + 2


def test_scalar_head_is_highest():
  config = tiny_config()
  assert set(precisions(forward_jaxpr(config, head="scalar"))) == {HIGHEST}
  assert set(precisions(grad_jaxpr(config, head="scalar"))) == {HIGHEST}


@pytest.mark.parametrize("remat", [False, True])
def test_bfloat16_auto_is_backend_default(remat):
  config = tiny_config(dtype="bfloat16", remat=remat)
  for jaxpr in (forward_jaxpr(config), grad_jaxpr(config), cached_jaxpr(config)):
    assert set(precisions(jaxpr)) <= set(BACKEND_DEFAULT)


def test_float32_default_is_backend_default():
  config = tiny_config(matmul_precision="default")
  for jaxpr in (forward_jaxpr(config), grad_jaxpr(config), cached_jaxpr(config)):
    assert set(precisions(jaxpr)) <= set(BACKEND_DEFAULT)


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="a GPU's default float32 matmul is TF32: the values differ there")
def test_highest_does_not_change_cpu_values():
  """On CPU every precision is true float32: the same logits."""
  tokens, mask = tokens_and_mask()
  outputs = []
  for precision in ("default", "highest"):
    model, params = init_model(tiny_config(matmul_precision=precision))
    outputs.append(np.asarray(jax.jit(
        lambda p: model.apply(p, tokens, attention_mask=mask)[0])(params)))
  np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-6, atol=1e-6)
