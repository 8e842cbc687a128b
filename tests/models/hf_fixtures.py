"""Tiny random transformers models, saved to disk, for parity tests (no downloads)."""

import numpy as np

VOCAB = 128


def tiny_hf_config(architecture: str, **changes):
  """A transformers config for a 2-layer model with GQA."""
  import transformers

  common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=96, rms_norm_eps=1e-6,
                max_position_embeddings=256, bos_token_id=None, eos_token_id=0, pad_token_id=0)
  if architecture == "qwen2":
    common.update(tie_word_embeddings=True, use_sliding_window=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    common.update(changes)
    return transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
  common.update(tie_word_embeddings=False, attention_bias=False,
                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 32})
  common.update(changes)
  return transformers.LlamaConfig(**common), transformers.LlamaForCausalLM


def save_tiny_hf_model(directory, architecture: str, seed: int = 0, **changes):
  """Builds a random transformers model, perturbs norms/biases (so they matter), saves it."""
  import torch

  config, cls = tiny_hf_config(architecture, **changes)
  torch.manual_seed(seed)
  model = cls(config).to(torch.float32).eval()
  with torch.no_grad():
    for name, tensor in model.named_parameters():
      if name.endswith("norm.weight") or name.endswith(".bias"):
        tensor.add_(0.1 * torch.randn_like(tensor))
  model.save_pretrained(str(directory), safe_serialization=True)
  return model


def hf_logits(model, input_ids, attention_mask=None, position_ids=None):
  import torch

  with torch.no_grad():
    out = model(input_ids=torch.as_tensor(np.asarray(input_ids), dtype=torch.long),
                attention_mask=None if attention_mask is None else torch.as_tensor(
                    np.asarray(attention_mask), dtype=torch.long),
                position_ids=None if position_ids is None else torch.as_tensor(
                    np.asarray(position_ids), dtype=torch.long))
  return out.logits.float().numpy()


FAMILY_VOCAB = 100
# Per family: (transformers config class, model class, options). Hidden 48 with 4 heads
# of head_dim 16 (≠ 48 / 4) checks that head_dim is read, not derived.
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(tie_word_embeddings=True, attention_bias=False, use_sliding_window=False)),
    # Olmo2Config has no head_dim: transformers derives it (48 / 4).
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM",
              dict(head_dim=12, tie_word_embeddings=False, attention_bias=False)),
    # RoPE on half of each head, and a window of 5 < the tests' 9-14 tokens.
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(head_dim=12, tie_word_embeddings=False, sliding_window=5,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                   "partial_rotary_factor": 0.5})),
    # A window of 4 < the tests' 9-14 tokens: ignoring it changes every later logit.
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(tie_word_embeddings=False, sliding_window=4)),
    # Sliding (window 4) then global layers; a score scale of 1/√24 (≠ 1/√head_dim), and
    # caps low enough to bite (std-0.2 weights keep raw scores and logits small).
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(tie_word_embeddings=True, sliding_window=4, query_pre_attn_scalar=24,
                    attn_logit_softcapping=1.5, final_logit_softcapping=2.0,
                    layer_types=["sliding_attention", "full_attention"])),
    # Global then sliding, as Gemma 3's last layers; RoPE bases far apart per layer type.
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(tie_word_embeddings=True, sliding_window=4, query_pre_attn_scalar=24,
                         layer_types=["full_attention", "sliding_attention"],
                         rope_parameters={
                             "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 50.0}})),
    # Every layer sparse: 4 experts of width 24, 2 per token, renormalised; the router's
    # weights are random like every tensor, so routes differ per token.
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(tie_word_embeddings=False, attention_bias=False,
                       use_sliding_window=False, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=24, norm_topk_prob=True,
                       decoder_sparse_step=1, mlp_only_layers=[])),
}

# Families whose parity tests sit in a file of their own (tests/models/hf/test_<family>.py)
# rather than in the FAMILIES-parametrised suites; built here alike.
OWN_FILE_FAMILIES = {
    # Sliding (window 4) then full layers, YaRN untruncated as gpt-oss has it, 4 experts of
    # width 24, 2 per token, and a SwiGLU clamp of 0.3 that the std-0.2 weights cross.
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                     swiglu_limit=0.3, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                      "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "truncate": False,
                                      "original_max_position_embeddings": 32})),
}


def family_hf_config(family: str, **changes):
  """The transformers config of a 2-layer model of `family` (FAMILIES' options, then
  `changes`)."""
  import transformers

  config_name, _, options = {**FAMILIES, **OWN_FILE_FAMILIES}[family]
  fields = dict(vocab_size=FAMILY_VOCAB, hidden_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=80, rms_norm_eps=1e-6, max_position_embeddings=256,
                bos_token_id=None, eos_token_id=0, pad_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
  fields.update(options)
  fields.update(changes)
  return getattr(transformers, config_name)(**fields)


def save_family_model(directory, family: str, seed: int = 0, **changes):
  """A 2-layer random transformers model of `family` with every tensor drawn from
  N(0, 0.2²) (norm weights and biases too), saved as safetensors; returns the model."""
  import torch
  import transformers

  config = family_hf_config(family, **changes)
  torch.manual_seed(seed)
  model_name = {**FAMILIES, **OWN_FILE_FAMILIES}[family][1]
  model = getattr(transformers, model_name)(config).to(torch.float32).eval()
  with torch.no_grad():
    for parameter in model.parameters():
      torch.nn.init.normal_(parameter, std=0.2)
  model.save_pretrained(str(directory), safe_serialization=True)
  return model


def assert_cached_decode_matches(model, params, tokens, full_mask, prompt_len: int, full,
                                 atol: float):
  """Prefill `tokens[:, :prompt_len]` into a KVCache, then decode the rest one token at a
  time; every real position's logits must equal the full forward's `full` [B, T, V].
  Returns the final cache."""
  import jax
  from rlhf_jax import models

  @jax.jit
  def step(params, cache, chunk, mask):
    return model.apply(params, chunk, attention_mask=mask, cache=cache)

  batch, length = tokens.shape
  cache = models.KVCache.create(model.config, batch=batch, slots=length)
  prompt_mask = full_mask[:, :prompt_len]
  logits, cache = step(params, cache, tokens[:, :prompt_len], prompt_mask)
  valid = prompt_mask == 1
  np.testing.assert_allclose(np.asarray(logits)[valid], full[:, :prompt_len][valid],
                             atol=atol)
  for t in range(prompt_len, length):
    logits, cache = step(params, cache, tokens[:, t:t + 1], np.ones((batch, 1), np.int32))
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=atol)
  return cache
