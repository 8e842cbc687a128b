"""models/hf/gemma.py: Gemma 2 and 3's config.json keys. The published configs read as
transformers' own config classes read them (layer types, RoPE bases, caps, scale) and
written back to themselves; the options we do not have refused in one line."""

from __future__ import annotations

import pytest

from rlhf_jax import models

pytest.importorskip("transformers")

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
