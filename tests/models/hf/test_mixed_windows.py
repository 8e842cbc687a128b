"""Qwen2 and Qwen3 configs whose `layer_types` mix sliding and full layers, through the
per-layer machinery (`blocks.LayerKind`), against transformers on tiny float32 models
with every tensor random: left-padded rows longer than the window, the export round
trip, and transformers 4's `max_window_layers` read as transformers 5 reads it."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from rlhf_jax import models
from tests.models.hf_fixtures import hf_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 100
# Full, sliding (window 3), sliding, full: rows of 12 tokens see past the window only
# through the full layers.
TYPES = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]


def save_model(directory, family: str, **changes):
  """A 4-layer random Qwen2/Qwen3, every tensor from N(0, 0.2²), saved; the model."""
  fields = dict(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=64, rms_norm_eps=1e-6,
                max_position_embeddings=256, bos_token_id=None, eos_token_id=0,
                pad_token_id=0, use_sliding_window=True, sliding_window=3, layer_types=TYPES,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
  fields.update(changes)
  name = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
  config = getattr(transformers, name + "Config")(**fields)
  torch.manual_seed(1)
  model = getattr(transformers, name + "ForCausalLM")(config).to(torch.float32).eval()
  with torch.no_grad():
    for parameter in model.parameters():
      torch.nn.init.normal_(parameter, std=0.2)
  model.save_pretrained(str(directory), safe_serialization=True)
  return model


def left_padded(lengths, width, seed=0):
  tokens = np.random.default_rng(seed).integers(3, VOCAB, (len(lengths), width))
  mask = (np.arange(width)[None, :] >= width - np.asarray(lengths)[:, None]).astype(np.int32)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return np.where(mask == 1, tokens, 0).astype(np.int32), mask, positions


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_mixed_layers_equal_transformers_and_export_back(family, tmp_path):
  hf_model = save_model(tmp_path / "in", family)
  model, params = models.load_hf_checkpoint(str(tmp_path / "in"))
  assert model.config.layer_types == tuple(TYPES) and model.config.sliding_window == 3
  tokens, mask, positions = left_padded([12, 8, 5], 12)
  valid = mask == 1
  expected = hf_logits(hf_model, tokens, attention_mask=mask, position_ids=positions)[valid]
  ours = np.asarray(jax.jit(lambda p: model.apply(p, tokens, attention_mask=mask)[0])(
      params))[valid]
  np.testing.assert_allclose(ours, expected, atol=1e-4)
  # Windows in every layer or none would be another model: the mix is what matches.
  for window in (None, 3):
    other = models.init_model(model.config.replace(layer_types=None, sliding_window=window),
                              abstract=True)[0]
    moved = np.asarray(jax.jit(lambda p, m=other: m.apply(p, tokens, attention_mask=mask)[0])(
        params))[valid]
    assert np.max(np.abs(moved - expected)) > 1e-2
  models.save_hf_checkpoint(str(tmp_path / "out"), model, params)
  written = json.loads((tmp_path / "out" / "config.json").read_text())
  assert written["layer_types"] == TYPES
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  np.testing.assert_allclose(
      hf_logits(reloaded, tokens, attention_mask=mask, position_ids=positions)[valid],
      expected, atol=1e-6)


def test_window_keys_are_read_as_transformers_reads_them():
  """Without layer_types the layers from max_window_layers on slide; without
  use_sliding_window no layer does (transformers 5 drops the window)."""
  base = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=VOCAB,
              hidden_size=48, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, intermediate_size=64, sliding_window=3)
  for change in (dict(use_sliding_window=True, max_window_layers=2),
                 dict(use_sliding_window=False, layer_types=TYPES),
                 dict(use_sliding_window=True, max_window_layers=0)):
    hf = {**base, **change}
    reference = transformers.Qwen3Config(**{k: v for k, v in hf.items()
                                            if k not in ("architectures", "model_type")})
    config = models.config_from_hf(hf)
    windows = [config.layer_window(i) for i in range(4)]
    assert windows == [reference.sliding_window if kind == "sliding_attention" else None
                       for kind in reference.layer_types], change
  with pytest.raises(ValueError, match=r"^config.json: layer_types=\['sliding'\] must list "
                     "num_hidden_layers=4 of full_attention, sliding_attention.$"):
    models.config_from_hf({**base, "use_sliding_window": True, "layer_types": ["sliding"]})


@pytest.mark.slow
def test_mixed_layers_decode_scan_and_pack_as_the_full_forward(tmp_path):
  """Qwen3 with mixed layers: the KV-cache decode (per-layer and stacked caches), the layer
  scan over the two kinds (a traced window per layer) and packed rows, each equal to the
  padded full forward."""
  from rlhf_jax.models import layer_scan
  from tests.models.hf_fixtures import assert_cached_decode_matches

  save_model(tmp_path, "qwen3")
  model, params = models.load_hf_checkpoint(str(tmp_path))
  tokens, mask, _ = left_padded([14, 12, 9], 14, seed=2)
  full = np.asarray(jax.jit(lambda p: model.apply(p, tokens, attention_mask=mask)[0])(params))
  for scan in (False, True):
    cached = models.init_model(model.config.replace(scan_layers=scan), abstract=True)[0]
    layout = layer_scan.stack_layer_params(params) if scan else params
    assert_cached_decode_matches(cached, layout, tokens, mask, 6, full, 1e-4)
  lengths = mask.sum(axis=1)[:2]
  packed, segments, positions = (np.zeros((1, 28), np.int32) for _ in range(3))
  packed[0, :26] = np.concatenate([tokens[r][mask[r] == 1] for r in range(2)])
  segments[0, :26] = np.repeat([1, 2], lengths)
  positions[0, :26] = np.concatenate([np.arange(n) for n in lengths])
  logits = np.asarray(jax.jit(lambda p: model.apply(
      p, packed, positions=positions, segment_ids=segments, attention_mask=segments > 0)[0])(
          params))[0]
  np.testing.assert_allclose(logits[:14], full[0][mask[0] == 1], atol=1e-5)
  np.testing.assert_allclose(logits[14:26], full[1][mask[1] == 1], atol=1e-5)
