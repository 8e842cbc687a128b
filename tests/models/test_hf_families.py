"""Each HF family against transformers on tiny random float32 models: logits on
left-padded rows, the export round trip, KV-cache decode, the layer scan and packed rows."""

import json
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models import layer_scan
from tests.models.hf_fixtures import FAMILIES
from tests.models.hf_fixtures import FAMILY_VOCAB
from tests.models.hf_fixtures import assert_cached_decode_matches
from tests.models.hf_fixtures import hf_logits
from tests.models.hf_fixtures import save_family_model

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOLERANCE = 1e-4
# What each family's tiny checkpoint must load as.
EXPECTED = {
    "qwen3": dict(architecture="qwen3", qk_norm="head", qkv_bias=False, head_dim=16,
                  tie_embeddings=True),
    "olmo2": dict(architecture="olmo2", qk_norm="projection", norm_placement="post",
                  qkv_bias=False, head_dim=12, tie_embeddings=False),
    "phi3": dict(architecture="phi3", qkv_bias=False, head_dim=12, rotary_dim=6,
                 sliding_window=5),
    "mistral": dict(architecture="mistral", qkv_bias=False, head_dim=16, sliding_window=4),
    "gemma2": dict(architecture="gemma2", norm_placement="sandwich", norm_offset=1.0,
                   scale_embeddings=True, activation="gelu_pytorch_tanh", sliding_window=4,
                   layer_types=("sliding_attention", "full_attention"),
                   query_pre_attn_scalar=24.0, attn_logit_softcapping=1.5,
                   final_logit_softcapping=2.0, rope_local_theta=None, tie_embeddings=True),
    "gemma3_text": dict(architecture="gemma3_text", qk_norm="head", norm_placement="sandwich",
                        norm_offset=1.0, scale_embeddings=True, sliding_window=4,
                        layer_types=("full_attention", "sliding_attention"),
                        query_pre_attn_scalar=24.0, attn_logit_softcapping=None,
                        final_logit_softcapping=None, rope_theta=10000.0,
                        rope_local_theta=50.0, tie_embeddings=True),
    "qwen3_moe": dict(architecture="qwen3_moe", qk_norm="head", qkv_bias=False,
                      num_experts=4, experts_per_token=2, expert_intermediate_size=24,
                      normalize_expert_weights=True, dense_layers=(), tie_embeddings=False),
}


class Family(typing.NamedTuple):
  name: str
  hf_model: typing.Any
  model: typing.Any
  params: typing.Any
  apply: typing.Any


@pytest.fixture(scope="module", params=tuple(FAMILIES))
def family(request, tmp_path_factory):
  directory = tmp_path_factory.mktemp(request.param)
  hf_model = save_family_model(directory, request.param)
  model, params = models.load_hf_checkpoint(str(directory))
  apply = jax.jit(lambda p, t, m: model.apply(p, t, attention_mask=m)[0])
  return Family(request.param, hf_model, model, params, apply)


def left_padded(seed, lengths, width):
  """(tokens, mask, positions) [len(lengths), width]: row r holds lengths[r] random
  tokens at its right end, 0 before them."""
  tokens = np.random.default_rng(seed).integers(3, FAMILY_VOCAB, (len(lengths), width))
  mask = (np.arange(width)[None, :] >= width - np.asarray(lengths)[:, None]).astype(np.int32)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return np.where(mask == 1, tokens, 0).astype(np.int32), mask, positions


def test_config_is_read(family):
  for name, value in EXPECTED[family.name].items():
    assert getattr(family.model.config, name) == value, name
  config = family.model.config
  assert sum(x.size for x in jax.tree.leaves(family.params)) == config.num_params()


def test_qwen3_with_a_window_in_every_layer(tmp_path):
  import transformers

  hf_model = save_family_model(tmp_path / "in", "qwen3", use_sliding_window=True,
                               sliding_window=3, max_window_layers=0)
  model, params = models.load_hf_checkpoint(str(tmp_path / "in"))
  assert model.config.sliding_window == 3
  tokens, mask, positions = left_padded(4, [12, 8], 12)
  valid = mask == 1
  expected = hf_logits(hf_model, tokens, attention_mask=mask, position_ids=positions)[valid]
  ours = np.asarray(jax.jit(model.apply)(params, tokens, attention_mask=mask)[0])[valid]
  np.testing.assert_allclose(ours, expected, atol=TOLERANCE)
  models.save_hf_checkpoint(str(tmp_path / "out"), model, params)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  np.testing.assert_allclose(
      hf_logits(reloaded, tokens, attention_mask=mask, position_ids=positions)[valid],
      expected, atol=1e-6)


def test_qwen3_moe_with_dense_layers_among_sparse_ones(tmp_path):
  """Three layers, `mlp_only_layers=[0, 2]`: layer 1 alone is sparse."""
  import transformers

  hf_model = save_family_model(tmp_path / "in", "qwen3_moe", num_hidden_layers=3,
                               mlp_only_layers=[0, 2])
  model, params = models.load_hf_checkpoint(str(tmp_path / "in"))
  assert model.config.dense_layers == (0, 2)
  assert set(params["layers"][1]["mlp"]) == {"router", "gate_proj", "up_proj", "down_proj"}
  tokens, mask, positions = left_padded(5, [11, 6], 11)
  valid = mask == 1
  expected = hf_logits(hf_model, tokens, attention_mask=mask, position_ids=positions)[valid]
  ours = np.asarray(jax.jit(model.apply)(params, tokens, attention_mask=mask)[0])[valid]
  np.testing.assert_allclose(ours, expected, atol=TOLERANCE)
  assert sum(x.size for x in jax.tree.leaves(params)) == model.config.num_params()
  models.save_hf_checkpoint(str(tmp_path / "out"), model, params)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  np.testing.assert_allclose(
      hf_logits(reloaded, tokens, attention_mask=mask, position_ids=positions)[valid],
      expected, atol=1e-6)
  with pytest.raises(ValueError, match=r"scan_layers=True needs every layer alike; "
                     r"dense_layers=\(0, 2\) mixes dense and sparse MLPs"):
    models.load_hf_checkpoint(str(tmp_path / "in"), scan_layers=True)


def test_logits_on_left_padded_rows(family):
  tokens, mask, positions = left_padded(0, [14, 9, 4], 14)
  expected = hf_logits(family.hf_model, tokens, attention_mask=mask, position_ids=positions)
  ours = np.asarray(family.apply(family.params, tokens, mask))
  valid = mask == 1
  delta = np.max(np.abs(ours[valid] - expected[valid]))
  print(f"{family.name}: max |Δlogit| vs transformers = {delta:.2e}")
  assert delta <= TOLERANCE


def test_export_loads_in_transformers_with_the_same_logits(family, tmp_path):
  import transformers

  models.save_hf_checkpoint(str(tmp_path), family.model, family.params)
  written = json.loads((tmp_path / "config.json").read_text())
  cls = type(family.hf_model).__name__
  assert written["architectures"] == [cls]
  model2, params2 = models.load_hf_checkpoint(str(tmp_path))
  assert model2.config == family.model.config
  jax.tree.map(np.testing.assert_array_equal, family.params, params2)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert type(reloaded).__name__ == cls
  tokens, mask, positions = left_padded(1, [11, 6], 11)
  valid = mask == 1
  np.testing.assert_allclose(
      hf_logits(reloaded, tokens, attention_mask=mask, position_ids=positions)[valid],
      hf_logits(family.hf_model, tokens, attention_mask=mask, position_ids=positions)[valid],
      atol=1e-6)


@pytest.mark.parametrize("layout", ["loop", "scan", "pallas"])
def test_kv_cache_prefill_and_decode_equal_the_full_forward(family, layout):
  """Per-layer and stacked caches; "pallas": the ragged decode kernel (interpret mode)."""
  params = family.params
  config = family.model.config.replace(scan_layers=layout == "scan",
                                       decode_attention="pallas" if layout == "pallas" else "xla")
  model = models.init_model(config, abstract=True)[0]
  if layout == "scan":
    params = layer_scan.stack_layer_params(params)
  prompt_len, steps = 6, 8
  tokens, full_mask, _ = left_padded(2, [14, 12, 9], prompt_len + steps)
  full = np.asarray(family.apply(family.params, tokens, full_mask))
  assert_cached_decode_matches(model, params, tokens, full_mask, prompt_len, full, TOLERANCE)


def test_layer_scan_and_packed_rows_equal_the_padded_forward(family):
  scanned = models.init_model(family.model.config.replace(scan_layers=True), abstract=True)[0]
  stacked = layer_scan.stack_layer_params(family.params)
  tokens, mask, _ = left_padded(3, [13, 7], 13)
  padded = np.asarray(family.apply(family.params, tokens, mask))
  np.testing.assert_allclose(
      jax.jit(lambda p: scanned.apply(p, tokens, attention_mask=mask)[0])(stacked), padded,
      atol=1e-5)
  # Both rows end to end in one buffer of 22 (2 of padding), positions restarting.
  lengths = mask.sum(axis=1)
  packed = np.zeros((1, 22), np.int32)
  packed[0, :20] = np.concatenate([tokens[r][mask[r] == 1] for r in range(2)])
  segments = np.zeros((1, 22), np.int32)
  segments[0, :20] = np.repeat([1, 2], lengths)
  positions = np.zeros((1, 22), np.int32)
  positions[0, :20] = np.concatenate([np.arange(n) for n in lengths])
  logits, _ = jax.jit(lambda p: family.model.apply(
      p, jnp.asarray(packed), positions=jnp.asarray(positions),
      segment_ids=jnp.asarray(segments), attention_mask=jnp.asarray(segments > 0)))(
          family.params)
  logits = np.asarray(logits)[0]
  np.testing.assert_allclose(logits[:13], padded[0][mask[0] == 1], atol=1e-5)
  np.testing.assert_allclose(logits[13:20], padded[1][mask[1] == 1], atol=1e-5)
