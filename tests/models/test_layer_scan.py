"""scan_layers=True (stacked layers, one lax.scan) against the per-layer Python loop on the
same weights: logits, scalar values, gradients (remat on and off), cached generation
(model and engine), the HF round trip, and the layout conversions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax import sampling
from rlhf_jax.models import layer_scan

VOCAB = 64
CONFIG = models.DecoderConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, intermediate_size=48)
SCANNED = CONFIG.replace(scan_layers=True)
TIGHT = dict(rtol=1e-5, atol=1e-6)


def tokens(seed, shape):
  """Random token ids [shape]."""
  return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, shape), jnp.int32)


def assert_trees_close(a, b, **tolerance):
  """Same tree structure and every leaf close (TIGHT unless given)."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **(tolerance or TIGHT)), a, b)


def test_stacked_init_holds_the_stacked_per_layer_parameters():
  _, params = models.init_model(CONFIG, seed=4)
  scanned, stacked = models.init_model(SCANNED, seed=4)
  jax.tree.map(np.testing.assert_array_equal, layer_scan.stack_layer_params(params), stacked)
  assert stacked["layers"]["mlp"]["up_proj"].shape == (2, 32, 48)
  axes = scanned.logical_axes()["layers"]
  assert axes["attention"]["q_proj"] == ("layers", "embed", "heads", "head_dim")
  assert axes["input_norm"]["weight"] == ("layers", "norm")
  spec = parallel.logical_to_spec(axes["mlp"]["up_proj"], parallel.TRAIN_RULES)
  assert spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  # Conversions are inverse to each other, and layer_params reads either layout.
  jax.tree.map(np.testing.assert_array_equal, layer_scan.unstack_layer_params(stacked), params)
  jax.tree.map(np.testing.assert_array_equal, layer_scan.layer_params(stacked, 1),
               layer_scan.layer_params(params, 1))
  with pytest.raises(ValueError, match="scan_layers='yes' must be a bool"):
    CONFIG.replace(scan_layers="yes")


def loss_and_logits(model, params, batch, mask):
  """(mean next-token NLL over real tokens, logits [B, T, V])."""
  logits, _ = model.apply(params, batch, attention_mask=mask)
  logprobs = kernels.token_logprobs(logits[:, :-1], batch[:, 1:])
  return -jnp.sum(logprobs * mask[:, 1:]) / jnp.sum(mask[:, 1:]), logits


@pytest.mark.parametrize("remat_policy", [None, "dots_saveable"])
def test_logits_and_gradients_agree(remat_policy):
  remat = dict(remat=remat_policy is not None, remat_policy=remat_policy or "nothing_saveable")
  model, params = models.init_model(CONFIG.replace(**remat), seed=1)
  scanned, _ = models.init_model(SCANNED.replace(**remat), abstract=True)
  batch = tokens(0, (2, 9))
  mask = jnp.asarray([[1] * 9, [0] * 3 + [1] * 6])  # one left-padded row
  grad = lambda m, p: jax.jit(jax.value_and_grad(
      lambda q: loss_and_logits(m, q, batch, mask), has_aux=True))(p)
  (value, logits), grads = grad(model, params)
  (scanned_value, scanned_logits), scanned_grads = grad(
      scanned, layer_scan.stack_layer_params(params))
  np.testing.assert_allclose(scanned_logits, logits, **TIGHT)
  np.testing.assert_allclose(scanned_value, value, **TIGHT)
  assert_trees_close(scanned_grads, layer_scan.stack_layer_params(grads))


def test_scalar_head_values_agree():
  critic, params = models.init_model(CONFIG, head="scalar", seed=2)
  scanned, _ = models.init_model(SCANNED, head="scalar", abstract=True)
  params = {**params, "scalar_head": params["scalar_head"] + 0.3}
  batch = tokens(1, (3, 7))
  values, _ = jax.jit(critic.apply)(params, batch)  # op by op: seconds of compiles
  scanned_values, _ = jax.jit(scanned.apply)(layer_scan.stack_layer_params(params), batch)
  assert scanned_values.shape == (3, 7)
  np.testing.assert_allclose(scanned_values, values, **TIGHT)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("time", [1, 3])
def test_cache_writes_equal_dynamic_update_slice(dtype, time):
  """Per-layer and stacked (uint16 bits on CPU for 16-bit caches) writes, starts clamped
  as `lax.dynamic_update_slice` clamps them."""
  rng = np.random.default_rng(time)
  cache = jnp.asarray(rng.normal(size=(3, 4, 2, 5, 8)), dtype)  # [L, B, K, D, S]
  update = jnp.asarray(rng.normal(size=(4, 2, 5, time)), dtype)
  start = jnp.asarray([0, 5, 7, 9], jnp.int32)
  expected = [layer_scan.write_rows(cache[i], update, start, axis=2) for i in range(3)]
  for i in range(3):
    written, _ = layer_scan.write_cache(cache[i], update, start, None, 2)
    np.testing.assert_array_equal(written, expected[i])
  bits = layer_scan._slow_scatter(cache.dtype)
  assert bits == (dtype == "bfloat16" and jax.default_backend() == "cpu")
  stacked = jax.lax.bitcast_convert_type(cache, jnp.uint16) if bits else cache
  write = jax.jit(lambda buffer, index: layer_scan.write_cache(
      buffer, update, start, layer_scan.LayerSlot(index, cache.dtype), 2))
  for i in range(3):
    stacked, rows = write(stacked, jnp.int32(i))
    np.testing.assert_array_equal(rows, expected[i])
  stacked = jax.lax.bitcast_convert_type(stacked, cache.dtype) if bits else stacked
  np.testing.assert_array_equal(stacked, np.stack(expected))


def cached_generation(model, params, prompt, mask, steps):
  """Prefill a left-padded batch into a 16-slot cache, then `steps` greedy decode steps:
  (the logits of every step [steps + 1, B, V], the final cache)."""
  @jax.jit
  def run(params):
    cache = models.KVCache.create(model.config, prompt.shape[0], 16)
    logits, cache = model.apply(params, prompt, attention_mask=mask, cache=cache, num_last=1)
    every = [logits[:, 0]]
    for _ in range(steps):
      token = jnp.argmax(every[-1], axis=-1).astype(jnp.int32)[:, None]
      logits, cache = model.apply(params, token, cache=cache, num_last=1)
      every.append(logits[:, 0])
    return jnp.stack(every), cache
  return run(params)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cached_generation_agrees(dtype):
  model, params = models.init_model(CONFIG.replace(dtype=dtype), seed=3)
  scanned, _ = models.init_model(SCANNED.replace(dtype=dtype), abstract=True)
  prompt = tokens(2, (2, 6))
  mask = jnp.asarray([[1] * 6, [0, 0, 1, 1, 1, 1]])
  logits, cache = cached_generation(model, params, prompt, mask, steps=2)
  scanned_logits, scanned_cache = cached_generation(
      scanned, layer_scan.stack_layer_params(params), prompt, mask, steps=2)
  # bfloat16: the two programs fuse differently, so roundings may differ.
  tolerance = TIGHT if dtype == "float32" else dict(atol=1e-2)
  f32 = lambda x: np.asarray(x, np.float32)
  np.testing.assert_allclose(f32(scanned_logits), f32(logits), **tolerance)
  assert scanned_cache.stacked and not cache.stacked
  assert scanned_cache.keys.shape == (2, 2, 2, 8, 16)
  assert scanned_cache.keys.dtype == cache.keys[0].dtype == jnp.dtype(dtype)
  np.testing.assert_allclose(f32(scanned_cache.keys), f32(np.stack(cache.keys)), **tolerance)
  np.testing.assert_allclose(f32(scanned_cache.values), f32(np.stack(cache.values)),
                             **tolerance)
  for name in ("valid", "end", "length"):
    np.testing.assert_array_equal(getattr(scanned_cache, name), getattr(cache, name))


def engine_tokens(model, params):
  """Greedy tokens of two prompts through prefill → insert → 4 generate steps."""
  engine = sampling.Engine(model, num_slots=3, cache_length=16)
  prefix = engine.prefill(params, np.asarray([[5, 9, 3, 0], [7, 2, 0, 0]]), np.asarray([3, 2]))
  state = engine.init_decode_state()
  greedy = engine.slot_sampling(sampling.SamplingParams(temperature=0, max_new_tokens=8), 0,
                                seed=0)
  for slot, row in ((2, 0), (0, 1)):
    state = engine.insert(prefix, state, slot, row=row, sampling=greedy)
  _, result = engine.generate_steps(params, state, 4)
  return np.asarray(result.tokens), np.asarray(result.model_logprobs)


def test_engine_generates_the_same_tokens():
  model, params = models.init_model(CONFIG, seed=5)
  params = {**params, "lm_head": params["lm_head"] * 30.0}  # peaked: argmax ties are rare
  scanned, _ = models.init_model(SCANNED, abstract=True)
  expected_tokens, expected_logprobs = engine_tokens(model, params)
  got_tokens, got_logprobs = engine_tokens(scanned, layer_scan.stack_layer_params(params))
  np.testing.assert_array_equal(got_tokens, expected_tokens)
  np.testing.assert_allclose(got_logprobs, expected_logprobs, atol=1e-5)


def test_hf_round_trip_with_scan_layers(tmp_path):
  pytest.importorskip("safetensors")
  model, params = models.init_model(CONFIG, seed=6)
  models.save_hf_checkpoint(str(tmp_path / "plain"), model, params)
  scanned, stacked = models.load_hf_checkpoint(str(tmp_path / "plain"), scan_layers=True)
  assert scanned.config.scan_layers
  jax.tree.map(np.testing.assert_array_equal, stacked, layer_scan.stack_layer_params(params))
  # Saving stacked parameters writes the same tensors, which load back per layer.
  models.save_hf_checkpoint(str(tmp_path / "scanned"), scanned, stacked)
  _, reloaded = models.load_hf_checkpoint(str(tmp_path / "scanned"))
  jax.tree.map(np.testing.assert_array_equal, reloaded, params)
  plain_files = (tmp_path / "plain" / "model.safetensors").read_bytes()
  assert (tmp_path / "scanned" / "model.safetensors").read_bytes() == plain_files
