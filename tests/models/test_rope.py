"""models/rope.py: the inverse frequencies and attention factor of each RoPE scaling against
transformers' own functions (`ROPE_INIT_FUNCTIONS`), and a YaRN-scaled Qwen3 against
transformers end to end (left-padded logits, the export round trip)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models import rope

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

BASE = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=100,
            hidden_size=64, num_hidden_layers=1, num_attention_heads=4, head_dim=32,
            intermediate_size=80, max_position_embeddings=4096)


@pytest.mark.parametrize("parameters", [
    dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024),
    dict(rope_type="yarn", factor=32.0, original_max_position_embeddings=4096, beta_fast=32,
         beta_slow=1, truncate=False),
    dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=512, mscale=0.707,
         mscale_all_dim=1.0, beta_fast=16, beta_slow=2),
    dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=2048,
         attention_factor=1.3),
    dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=1024),
])
def test_frequencies_and_attention_factor_equal_transformers(parameters):
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # pylint: disable=import-outside-toplevel
  hf = dict(BASE, rope_parameters=dict(parameters, rope_theta=500000.0))
  reference = transformers.Qwen3Config(**{k: v for k, v in hf.items()
                                           if k not in ("architectures", "model_type")})
  want, factor = ROPE_INIT_FUNCTIONS[parameters["rope_type"]](reference, "cpu")
  config = models.config_from_hf(hf)
  np.testing.assert_allclose(rope.rope_inverse_frequencies(config), want.numpy(), rtol=1e-5)
  cos, sin = rope.rope_tables(np.asarray([[0, 5]]), config)
  np.testing.assert_allclose(cos[0, 0, 0, 0], factor, rtol=1e-6)  # cos(0)·attention factor
  assert models.config_from_hf(models.config_to_hf(config)).rope_scaling == config.rope_scaling


def test_a_yarn_scaled_qwen3_equals_transformers_and_exports_back(tmp_path):
  from tests.models.hf_fixtures import hf_logits, save_family_model  # pylint: disable=import-outside-toplevel
  hf_model = save_family_model(tmp_path / "in", "qwen3", rope_parameters={
      "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
      "original_max_position_embeddings": 64})
  model, params = models.load_hf_checkpoint(str(tmp_path / "in"))
  assert model.config.rope_scaling.attention_factor == pytest.approx(0.1 * np.log(4) + 1)
  mask = np.asarray([[1] * 12, [0] * 7 + [1] * 5], np.int32)  # the second row left-padded
  tokens = np.where(mask == 1, np.random.default_rng(7).integers(3, 100, (2, 12)), 0)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  valid = mask == 1
  expected = hf_logits(hf_model, tokens, attention_mask=mask, position_ids=positions)[valid]
  ours = np.asarray(jax.jit(model.apply)(params, tokens, attention_mask=mask)[0])[valid]
  np.testing.assert_allclose(ours, expected, atol=1e-4)
  models.save_hf_checkpoint(str(tmp_path / "out"), model, params)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  np.testing.assert_allclose(
      hf_logits(reloaded, tokens, attention_mask=mask, position_ids=positions)[valid],
      expected, atol=1e-5)


def test_an_unknown_rope_type_is_refused_naming_the_supported_ones():
  with pytest.raises(ValueError, match="rope_type='dynamic' is not supported; supported: "
                     "'default', 'llama3', 'yarn'"):
    models.config_from_hf(dict(BASE, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                      "rope_theta": 1e4}))
