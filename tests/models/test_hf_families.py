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
from rlhf_jax.models.hf import peft
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
  ours = np.asarray(model.apply(params, tokens, attention_mask=mask)[0])[valid]
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
  ours = np.asarray(model.apply(params, tokens, attention_mask=mask)[0])[valid]
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


def test_qwen3_moe_decoder_sparse_step_and_experts_are_read_as_transformers_reads_them():
  import transformers

  hf = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=100,
            hidden_size=48, num_hidden_layers=6, num_attention_heads=4, intermediate_size=80,
            num_experts=8, num_experts_per_tok=3, moe_intermediate_size=16,
            decoder_sparse_step=3, mlp_only_layers=[5])
  config = models.config_from_hf(hf)
  reference = transformers.Qwen3MoeConfig(**{k: v for k, v in hf.items()
                                            if k not in ("architectures", "model_type")})
  layers = transformers.Qwen3MoeForCausalLM(reference).model.layers
  sparse = [i for i, layer in enumerate(layers) if hasattr(layer.mlp, "experts")]
  assert [i for i in range(6) if config.sparse_layer(i)] == sparse == [2]
  assert (config.num_experts, config.experts_per_token, config.expert_intermediate_size,
          config.normalize_expert_weights) == (8, 3, 16, reference.norm_topk_prob)


@pytest.mark.parametrize("architecture", ["MixtralForCausalLM", "DeepseekV3ForCausalLM"])
def test_moe_we_do_not_have_is_refused_in_one_line(architecture):
  hf = dict(architectures=[architecture], vocab_size=100, hidden_size=48,
            num_hidden_layers=2, num_attention_heads=4, intermediate_size=80)
  with pytest.raises(ValueError, match=f"^config.json: {architecture} is a "
                     "mixture-of-experts model we do not have; supported: "
                     "Qwen3MoeForCausalLM.$"):
    models.config_from_hf(hf)


def test_unsupported_family_options_are_refused():
  hf = dict(architectures=["Qwen3ForCausalLM"], vocab_size=100, hidden_size=48,
            num_hidden_layers=2, num_attention_heads=4, intermediate_size=80)
  with pytest.raises(ValueError, match="attention_bias=true .* Qwen3ForCausalLM"):
    models.config_from_hf({**hf, "attention_bias": True})
  config = models.config_from_hf(hf)
  with pytest.raises(ValueError, match="qk_norm='head'; qk_norm='none' cannot be saved"):
    models.config_to_hf(config.replace(qk_norm="none"))
  mixed = dict(hf, sliding_window=4, layer_types=["full_attention", "sliding_attention"])
  with pytest.raises(ValueError, match="mixes sliding and full attention layers"):
    models.config_from_hf(mixed)
  phi3 = dict(hf, architectures=["Phi3ForCausalLM"])
  with pytest.raises(ValueError, match="^config.json: rope_type='longrope' is not supported"):
    models.config_from_hf(dict(phi3, rope_parameters={"rope_type": "longrope"}))
  with pytest.raises(ValueError, match="partial_rotary_factor=0.5 is not supported for Qwen3"):
    models.config_from_hf(dict(hf, partial_rotary_factor=0.5))
  with pytest.raises(ValueError, match="architecture='phi3' are not supported yet"):
    peft.peft_tensors(models.init_model(models.config_from_hf(phi3), abstract=True)[0], {})


def test_a_fused_tensor_of_the_wrong_size_is_named(tmp_path):
  from safetensors.numpy import load_file, save_file

  save_family_model(tmp_path, "phi3")
  path = tmp_path / "model.safetensors"
  tensors = load_file(str(path))
  name = "model.layers.1.self_attn.qkv_proj.weight"
  tensors[name] = np.concatenate([tensors[name], tensors[name][:2]])
  save_file(tensors, str(path), metadata={"format": "pt"})
  with pytest.raises(ValueError, match=rf"fused tensor '{name}' has shape \(98, 48\); "
                     "expected 96 rows"):
    models.load_hf_checkpoint(str(tmp_path))


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


# In the layout of the published google/gemma-2-2b and google/gemma-3-1b-it config.json
# (transformers 4 keys: rope_theta, rope_local_base_freq, sliding_window_pattern).
GEMMA2_2B = dict(
    architectures=["Gemma2ForCausalLM"], model_type="gemma2", attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0, head_dim=256, hidden_act="gelu_pytorch_tanh",
    hidden_activation="gelu_pytorch_tanh", hidden_size=2304, intermediate_size=9216,
    max_position_embeddings=8192, num_attention_heads=8, num_hidden_layers=26,
    num_key_value_heads=4, query_pre_attn_scalar=256, rms_norm_eps=1e-6, rope_theta=10000.0,
    sliding_window=4096, vocab_size=256000, bos_token_id=2, eos_token_id=1, pad_token_id=0)
GEMMA3_1B = dict(
    architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", attn_logit_softcapping=None,
    final_logit_softcapping=None, head_dim=256, hidden_activation="gelu_pytorch_tanh",
    hidden_size=1152, intermediate_size=6912, max_position_embeddings=32768,
    num_attention_heads=4, num_hidden_layers=26, num_key_value_heads=1,
    query_pre_attn_scalar=256, rms_norm_eps=1e-6, rope_local_base_freq=10000,
    rope_scaling=None, rope_theta=1000000, sliding_window=512, sliding_window_pattern=6,
    vocab_size=262144, bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0)


@pytest.mark.parametrize("hf,cls", [(GEMMA2_2B, "Gemma2Config"), (GEMMA3_1B, "Gemma3TextConfig")])
def test_gemma_configs_read_as_transformers_reads_them(hf, cls):
  """Layer types, RoPE bases, caps and scale as transformers' own config class derives them
  from the same keys (defaults and legacy keys included)."""
  import transformers

  ours = models.config_from_hf(hf)
  theirs = getattr(transformers, cls)(**hf)
  assert ours.layer_types == tuple(theirs.layer_types)
  assert ours.layer_types.count("full_attention") == (13 if cls == "Gemma2Config" else 4)
  assert ours.sliding_window == theirs.sliding_window
  assert ours.query_pre_attn_scalar == theirs.query_pre_attn_scalar
  assert ours.final_logit_softcapping == theirs.final_logit_softcapping
  assert ours.tie_embeddings == theirs.tie_word_embeddings is True
  assert ours.activation == theirs.hidden_activation
  if cls == "Gemma2Config":
    assert ours.attn_logit_softcapping == theirs.attn_logit_softcapping == 50.0
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
  else:  # Gemma 3's attention never caps; sliding layers rotate at their own base
    assert ours.attn_logit_softcapping is None
    assert ours.rope_theta == theirs.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert ours.rope_local_theta == theirs.rope_parameters["sliding_attention"]["rope_theta"]
    assert [ours.layer_local_rope(i) for i in range(6)] == [True] * 5 + [False]
  assert sum(ours.layer_window(i) is None for i in range(ours.num_layers)) == (
      ours.layer_types.count("full_attention"))
  assert models.config_from_hf(models.config_to_hf(ours)) == ours


def test_gemma_options_we_do_not_have_are_refused_in_one_line():
  scaled = dict(GEMMA3_1B, rope_scaling={"rope_type": "linear", "factor": 8.0})
  with pytest.raises(ValueError, match="^config.json: rope_type='linear' is not supported"):
    models.config_from_hf(scaled)
  with pytest.raises(ValueError, match="^config.json: use_bidirectional_attention=true is not"):
    models.config_from_hf(dict(GEMMA3_1B, use_bidirectional_attention=True))
  config = models.config_from_hf(GEMMA2_2B)
  with pytest.raises(ValueError, match="Gemma2ForCausalLM checkpoints have norm_offset=1.0"):
    models.config_to_hf(config.replace(norm_offset=0.0))
  with pytest.raises(ValueError, match="LlamaForCausalLM checkpoints have "
                     "activation='silu'; activation='gelu_pytorch_tanh' cannot be saved"):
    models.config_to_hf(config.replace(architecture="llama", norm_placement="pre",
                                       norm_offset=0.0, scale_embeddings=False))
  gemma3 = models.config_from_hf(GEMMA3_1B)
  with pytest.raises(ValueError, match="Gemma3ForCausalLM checkpoints have "
                     "attn_logit_softcapping=None"):
    models.config_to_hf(gemma3.replace(attn_logit_softcapping=50.0))
