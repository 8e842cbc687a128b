"""gpt-oss (`GptOssForCausalLM`) against transformers on a tiny float32 model with every
tensor random (sinks, router weights and biases, the experts' biases, q/k/v/o biases):
logits on left-padded rows, KV-cache decode, the export round trip, packed rows and the
layer scan over alternating sliding/full layers; an MXFP4 checkpoint against its
dequantised twin; the config.json refusals."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models import layer_scan
from tests.models.hf_fixtures import FAMILY_VOCAB as VOCAB
from tests.models.hf_fixtures import assert_cached_decode_matches
from tests.models.hf_fixtures import hf_logits
from tests.models.hf_fixtures import save_family_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4


def save_gpt_oss(directory, **changes):
  """hf_fixtures' tiny gpt-oss (sliding window 4 < the rows' 9-14 tokens, then a full
  layer; YaRN; a SwiGLU clamp that bites), every tensor from N(0, 0.2²), saved."""
  return save_family_model(directory, "gpt_oss", **changes)


def left_padded(seed, lengths, width):
  """(tokens, mask, positions): row r holds lengths[r] random tokens at its right end."""
  tokens = np.random.default_rng(seed).integers(3, VOCAB, (len(lengths), width))
  mask = (np.arange(width)[None, :] >= width - np.asarray(lengths)[:, None]).astype(np.int32)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return np.where(mask == 1, tokens, 0).astype(np.int32), mask, positions


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
  directory = tmp_path_factory.mktemp("gpt_oss")
  hf_model = save_gpt_oss(directory)
  model, params = models.load_hf_checkpoint(str(directory))
  return directory, hf_model, model, params


def test_config_and_logits_on_left_padded_rows_equal_transformers(gpt_oss):
  _, hf_model, model, params = gpt_oss
  config = model.config
  assert (config.architecture, config.num_experts, config.experts_per_token,
          config.expert_intermediate_size) == ("gpt_oss", 4, 2, 24)
  assert config.layer_types == ("sliding_attention", "full_attention")
  assert config.attention_sinks and config.qkv_bias and config.attention_out_bias
  assert config.expert_biases and config.activation == "clamped_swiglu"
  assert config.swiglu_limit == 0.3 and not config.rope_scaling.truncate
  assert sum(x.size for x in jax.tree.leaves(params)) == config.num_params()
  assert sum(p.numel() for p in hf_model.parameters()) == config.num_params()
  tokens, mask, positions = left_padded(0, [14, 9, 4], 14)
  expected = hf_logits(hf_model, tokens, attention_mask=mask, position_ids=positions)
  forward = jax.jit(lambda p: model.apply(p, tokens, attention_mask=mask)[0])
  ours = np.asarray(forward(params))
  valid = mask == 1
  delta = np.max(np.abs(ours[valid] - expected[valid]))
  print(f"gpt_oss: max |Δlogit| vs transformers = {delta:.2e}")
  assert delta <= TOLERANCE
  # The sinks matter: without them the logits move far past the tolerance.
  sinkless = jax.tree.map(lambda x: x, params)
  for layer in sinkless["layers"].values():
    layer["attention"]["sinks"] = jnp.full_like(layer["attention"]["sinks"], -1e4)
  moved = np.asarray(forward(sinkless))
  assert np.max(np.abs(moved[valid] - expected[valid])) > 100 * TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["loop", "scan", "pallas"])
def test_kv_cache_prefill_and_decode_equal_the_full_forward(gpt_oss, layout):
  _, _, model, params = gpt_oss
  config = model.config.replace(scan_layers=layout == "scan",
                                decode_attention="pallas" if layout == "pallas" else "xla")
  cached = models.init_model(config, abstract=True)[0]
  if layout == "scan":
    params = layer_scan.stack_layer_params(params)
  prompt_len, steps = 6, 8
  tokens, full_mask, _ = left_padded(2, [14, 12, 9], prompt_len + steps)
  full = np.asarray(jax.jit(lambda p: model.apply(p, tokens, attention_mask=full_mask)[0])(
      gpt_oss[3]))
  assert_cached_decode_matches(cached, params, tokens, full_mask, prompt_len, full, TOLERANCE)


@pytest.mark.slow
def test_layer_scan_and_packed_rows_equal_the_padded_forward(gpt_oss):
  _, _, model, params = gpt_oss
  scanned = models.init_model(model.config.replace(scan_layers=True), abstract=True)[0]
  tokens, mask, _ = left_padded(3, [13, 7], 13)
  padded = np.asarray(jax.jit(lambda p: model.apply(p, tokens, attention_mask=mask)[0])(params))
  np.testing.assert_allclose(
      jax.jit(lambda p: scanned.apply(p, tokens, attention_mask=mask)[0])(
          layer_scan.stack_layer_params(params)), padded, atol=1e-5)
  lengths = mask.sum(axis=1)
  packed, segments, positions = (np.zeros((1, 22), np.int32) for _ in range(3))
  packed[0, :20] = np.concatenate([tokens[r][mask[r] == 1] for r in range(2)])
  segments[0, :20] = np.repeat([1, 2], lengths)
  positions[0, :20] = np.concatenate([np.arange(n) for n in lengths])
  logits = np.asarray(jax.jit(lambda p: model.apply(
      p, jnp.asarray(packed), positions=jnp.asarray(positions),
      segment_ids=jnp.asarray(segments), attention_mask=jnp.asarray(segments > 0))[0])(
          params))[0]
  np.testing.assert_allclose(logits[:13], padded[0][mask[0] == 1], atol=1e-5)
  np.testing.assert_allclose(logits[13:20], padded[1][mask[1] == 1], atol=1e-5)


@pytest.mark.slow
def test_export_loads_in_transformers_with_the_same_logits(gpt_oss, tmp_path):
  _, hf_model, model, params = gpt_oss
  models.save_hf_checkpoint(str(tmp_path), model, params)
  reloaded_model, reloaded_params = models.load_hf_checkpoint(str(tmp_path))
  assert reloaded_model.config == model.config
  jax.tree.map(np.testing.assert_array_equal, params, reloaded_params)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert type(reloaded).__name__ == "GptOssForCausalLM"
  for name, tensor in hf_model.state_dict().items():  # gate_up interleaved back as it was
    np.testing.assert_array_equal(reloaded.state_dict()[name].numpy(), tensor.numpy(), name)


def _mxfp4_twins(source, root):
  """(MXFP4 checkpoint, its bf16 twin): the source's experts replaced by random MXFP4
  blocks and scales, and by transformers' own dequantisation of them (`*_blocks`
  [X, out, in/32, 16], the bf16 tensors [X, in, out])."""
  from safetensors.numpy import load_file
  from safetensors.numpy import save_file
  from transformers.integrations.mxfp4 import convert_moe_packed_tensors

  tensors = load_file(str(source / "model.safetensors"))
  quantised, twin = root / "mxfp4", root / "bf16"
  for directory in (quantised, twin):
    shutil.copytree(source, directory)
  rng = np.random.default_rng(7)
  packed, dense = dict(tensors), dict(tensors)
  for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
    experts, rows, columns = tensors[name].shape  # [X, in, out]
    blocks = rng.integers(0, 256, (experts, columns, rows // 32, 16), dtype=np.uint8)
    scales = rng.integers(122, 127, (experts, columns, rows // 32), dtype=np.uint8)
    del packed[name]
    packed.update({name + "_blocks": blocks, name + "_scales": scales})
    dense[name] = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(
        scales), dtype=torch.float32).numpy()
  save_file(packed, str(quantised / "model.safetensors"), metadata={"format": "pt"})
  save_file(dense, str(twin / "model.safetensors"), metadata={"format": "pt"})
  config = json.loads((quantised / "config.json").read_text())
  config["quantization_config"] = {"quant_method": "mxfp4",
                                   "modules_to_not_convert": ["model.layers.*.self_attn"]}
  (quantised / "config.json").write_text(json.dumps(config))
  return quantised, twin


@pytest.mark.slow
def test_an_mxfp4_checkpoint_loads_equal_to_its_dequantised_twin(tmp_path):
  # Widths of 64: MXFP4 blocks hold 32 values, so every expert matrix is whole blocks.
  source = tmp_path / "source"
  save_gpt_oss(source, hidden_size=64, intermediate_size=64)
  quantised, twin = _mxfp4_twins(source, tmp_path)
  model, params = models.load_hf_checkpoint(str(quantised))
  twin_model, twin_params = models.load_hf_checkpoint(str(twin))
  assert model.config == twin_model.config
  jax.tree.map(np.testing.assert_array_equal, params, twin_params)
  tokens, mask, positions = left_padded(4, [12, 7], 12)
  valid = mask == 1
  reference = transformers.AutoModelForCausalLM.from_pretrained(str(twin)).eval()
  np.testing.assert_allclose(
      np.asarray(jax.jit(lambda p: model.apply(p, tokens, attention_mask=mask)[0])(
          params))[valid],
      hf_logits(reference, tokens, attention_mask=mask, position_ids=positions)[valid],
      atol=TOLERANCE)
  # The export is plain tensors (no MXFP4, no quantization_config), loaded by transformers.
  models.save_hf_checkpoint(str(tmp_path / "out"), model, params)
  written = json.loads((tmp_path / "out" / "config.json").read_text())
  assert "quantization_config" not in written
  exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  np.testing.assert_allclose(
      hf_logits(exported, tokens, attention_mask=mask, position_ids=positions)[valid],
      hf_logits(reference, tokens, attention_mask=mask, position_ids=positions)[valid],
      atol=1e-6)


def test_config_json_defaults_and_refusals():
  hf = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=VOCAB,
            hidden_size=48, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=24, num_local_experts=4, num_experts_per_tok=2)
  config = models.config_from_hf(hf)
  reference = transformers.GptOssConfig(**{k: v for k, v in hf.items()
                                           if k not in ("architectures", "model_type")})
  assert list(config.layer_types) == reference.layer_types
  assert (config.sliding_window, config.head_dim, config.rms_norm_eps) == (
      reference.sliding_window, reference.head_dim, reference.rms_norm_eps)
  assert config.rope_scaling.factor == reference.rope_parameters["factor"]
  assert config.rope_theta == 150000.0 and not config.rope_scaling.truncate
  for change, message in [
      (dict(quantization_config={"quant_method": "bitsandbytes"}),
       "^config.json: quantization_config.quant_method='bitsandbytes' is not supported for "
       r"GptOssForCausalLM; only 'mxfp4' \(dequantised on load\).$"),
      (dict(layer_types=["sliding_attention"] * 3),
       "^config.json: layer_types=.* must list num_hidden_layers=4 of full_attention, "
       "sliding_attention.$")]:
    with pytest.raises(ValueError, match=message):
      models.config_from_hf({**hf, **change})
  with pytest.raises(ValueError, match="^DecoderConfig.attention_impl='cudnn' cannot compute "
                     "attention_sinks"):
    models.config_from_hf(hf, attention_impl="cudnn")


def test_mxfp4_experts_that_do_not_fit_are_named(gpt_oss, tmp_path):
  from safetensors.numpy import load_file
  from safetensors.numpy import save_file

  directory = tmp_path / "mxfp4"
  shutil.copytree(gpt_oss[0], directory)
  tensors = load_file(str(directory / "model.safetensors"))
  name = "model.layers.1.mlp.experts.down_proj"
  del tensors[name]  # [X, F, E] = [4, 24, 48]; 2 blocks of 32 give rows of 64, not 24
  tensors[name + "_blocks"] = np.zeros((4, 48, 2, 16), np.uint8)
  tensors[name + "_scales"] = np.full((4, 48, 2), 127, np.uint8)
  save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(ValueError, match=f"^{directory}: MXFP4 tensor '{name}' has blocks "
                     r"\(4, 48, 2, 16\); expected ones that map to \(4, 24, 48\).$"):
    models.load_hf_checkpoint(str(directory))
  del tensors[name + "_scales"]
  save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(ValueError, match=f"tensor '{name}' is missing"):
    models.load_hf_checkpoint(str(directory))



def test_bfloat16_rmsnorm_multiplies_by_its_weight_in_float32_as_transformers(gpt_oss):
  """transformers' GptOssRMSNorm casts after the weight multiply (Llama's before): in bf16
  the two differ by a rounding, which flipped a route and moved a logit by 0.12."""
  from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm
  from rlhf_jax.models.blocks import RMSNorm

  config = gpt_oss[2].config.replace(dtype="bfloat16", param_dtype="bfloat16")
  rng = np.random.default_rng(8)
  x = torch.from_numpy(rng.standard_normal((16, 48)).astype(np.float32)).to(torch.bfloat16)
  weight = torch.from_numpy(rng.standard_normal(48).astype(np.float32)).to(torch.bfloat16)
  theirs = GptOssRMSNorm(48, eps=config.rms_norm_eps)
  with torch.no_grad():
    theirs.weight.copy_(weight)
    expected = theirs(x).float().numpy()
  ours = RMSNorm(config)
  ours.weight[...] = jnp.asarray(weight.float().numpy(), jnp.bfloat16)
  got = np.asarray(ours(jnp.asarray(x.float().numpy(), jnp.bfloat16)).astype(jnp.float32))
  np.testing.assert_array_equal(got, expected)


@pytest.mark.slow
def test_the_published_gpt_oss_20b_config_reads_as_transformers_builds_it():
  """openai/gpt-oss-20b's config.json (MXFP4 experts): our parameter count is that of the
  model transformers builds from it (on the meta device), 20.9B."""
  hf = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", attention_bias=True,
            head_dim=64, hidden_act="silu", hidden_size=2880, intermediate_size=2880,
            layer_types=["sliding_attention", "full_attention"] * 12,
            max_position_embeddings=131072, num_attention_heads=64, num_experts_per_tok=4,
            num_hidden_layers=24, num_key_value_heads=8, num_local_experts=32,
            rms_norm_eps=1e-05, rope_theta=150000, sliding_window=128, swiglu_limit=7.0,
            tie_word_embeddings=False, vocab_size=201088, eos_token_id=200002,
            pad_token_id=199999,
            quantization_config={"quant_method": "mxfp4",
                                 "modules_to_not_convert": ["model.layers.*.self_attn"]},
            rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                          "original_max_position_embeddings": 4096, "rope_type": "yarn",
                          "truncate": False})
  config = models.config_from_hf(hf)
  reference = transformers.GptOssConfig(**{k: v for k, v in hf.items() if k not in (
      "architectures", "model_type", "quantization_config")})
  with torch.device("meta"):
    built = transformers.GptOssForCausalLM(reference)
  assert config.num_params() == sum(p.numel() for p in built.parameters())
  assert (config.rope_scaling.factor, config.rope_scaling.truncate) == (32.0, False)


@pytest.mark.slow
def test_a_model_without_a_source_exports_a_config_transformers_builds_alike(gpt_oss, tmp_path):
  """No source checkpoint: config.json is all ours (`config_to_hf`: layer types, YaRN, the
  SwiGLU clamp, the experts' keys), and transformers' forward equals ours."""
  params = gpt_oss[3]  # the loaded weights, under a model built from a config alone
  model = models.init_model(gpt_oss[2].config.replace(swiglu_limit=5.0), abstract=True)[0]
  models.save_hf_checkpoint(str(tmp_path), model, params)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert (reloaded.config.swiglu_limit, reloaded.config.layer_types) == (
      5.0, ["sliding_attention", "full_attention"])
  tokens, mask, positions = left_padded(9, [12, 7], 12)
  valid = mask == 1
  np.testing.assert_allclose(
      np.asarray(jax.jit(lambda p: model.apply(p, tokens, attention_mask=mask)[0])(
          params))[valid],
      hf_logits(reloaded, tokens, attention_mask=mask, position_ids=positions)[valid],
      atol=TOLERANCE)
