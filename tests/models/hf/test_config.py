"""models/hf/config.py: config.json ↔ DecoderConfig. Every family's config as
transformers writes it, read and written back to itself and to what transformers reads;
the MoE layout read as transformers reads it; what we do not have refused in one line;
the runtime numerics kept out of config.json."""

from __future__ import annotations

import pytest

from rlhf_jax import models
from tests.models.hf_fixtures import FAMILIES
from tests.models.hf_fixtures import family_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

# The keys transformers reads the shape of a model from, in each family's config class.
SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "tie_word_embeddings", "rms_norm_eps", "max_position_embeddings")


@pytest.mark.parametrize("family", tuple(FAMILIES))
def test_a_config_transformers_wrote_comes_back_as_transformers_reads_it(family):
  """config.json of transformers → ours → config.json: read again it is the same
  DecoderConfig, and transformers' own config class reads the same shape from it."""
  import transformers

  theirs = family_hf_config(family)
  ours = models.config_from_hf(theirs.to_dict())
  written = models.config_to_hf(ours)
  assert models.config_from_hf(written) == ours
  reread = type(theirs)(**{k: v for k, v in written.items() if k != "model_type"})
  for key in SHAPE_KEYS:
    assert getattr(reread, key) == getattr(theirs, key), key
  assert getattr(reread, "head_dim", None) == getattr(theirs, "head_dim", None)
  assert written["architectures"] == [FAMILIES[family][1]]
  assert isinstance(transformers.AutoConfig.for_model(written["model_type"]), type(theirs))


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
                     "Qwen3MoeForCausalLM, GptOssForCausalLM.$"):
    models.config_from_hf(hf)


def test_unsupported_family_options_are_refused():
  hf = dict(architectures=["Qwen3ForCausalLM"], vocab_size=100, hidden_size=48,
            num_hidden_layers=2, num_attention_heads=4, intermediate_size=80)
  with pytest.raises(ValueError, match="attention_bias=true .* Qwen3ForCausalLM"):
    models.config_from_hf({**hf, "attention_bias": True})
  config = models.config_from_hf(hf)
  with pytest.raises(ValueError, match="qk_norm='head'; qk_norm='none' cannot be saved"):
    models.config_to_hf(config.replace(qk_norm="none"))
  phi3 = dict(hf, architectures=["Phi3ForCausalLM"])
  with pytest.raises(ValueError, match="^config.json: rope_type='longrope' is not supported"):
    models.config_from_hf(dict(phi3, rope_parameters={"rope_type": "longrope"}))
  with pytest.raises(ValueError, match="partial_rotary_factor=0.5 is not supported for Qwen3"):
    models.config_from_hf(dict(hf, partial_rotary_factor=0.5))


def test_matmul_precision_is_not_in_hf_config():
  config = models.DecoderConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                                num_kv_heads=2, head_dim=8, intermediate_size=48,
                                max_position_embeddings=256, matmul_precision="highest")
  hf = models.config_to_hf(config)
  assert not any("precision" in key for key in hf)
  assert models.config_from_hf(hf).matmul_precision == "auto"
  assert models.config_from_hf(hf, matmul_precision="highest") == config
