"""models/decoder_config.py: each field's refusal is one line naming the field; the
per-layer answers (window, local RoPE base, sparse MLP), the derived numbers (rotary
dims, score scale, matmul precision) and the parameter count against the definitions in
the class docstring and against the arrays a model of the config holds."""

from __future__ import annotations

import jax
import pytest

from rlhf_jax import models
from rlhf_jax.models.decoder_config import DecoderConfig

CONFIG = DecoderConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8, intermediate_size=48)
MOE = dict(num_experts=4, experts_per_token=2, expert_intermediate_size=16)


def tiny_config(**changes) -> DecoderConfig:
  """A one-layer config with `changes` (validated as it is built)."""
  return DecoderConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                       num_kv_heads=2, head_dim=8, intermediate_size=48,
                       max_position_embeddings=256).replace(**changes)


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="num_heads=6 must be a multiple of num_kv_heads=4"):
    CONFIG.replace(num_heads=6, num_kv_heads=4)
  with pytest.raises(ValueError, match="remat_policy='sometimes'"):
    CONFIG.replace(remat_policy="sometimes")
  with pytest.raises(ValueError, match="dtype='float8'"):
    CONFIG.replace(dtype="float8")


@pytest.mark.parametrize("field, changes", [
    ("vocab_size", dict(vocab_size=0)),
    ("hidden_size", dict(hidden_size=-32)),
    ("num_layers", dict(num_layers=True)),  # a bool is no count
    ("num_heads", dict(num_heads=4.0)),
    ("head_dim", dict(head_dim=7)),  # RoPE rotates pairs
    ("architecture", dict(architecture="gpt2")),
    ("partial_rotary_factor", dict(partial_rotary_factor=0.0)),
    ("partial_rotary_factor", dict(partial_rotary_factor=1.5)),
    ("partial_rotary_factor", dict(partial_rotary_factor=0.1)),  # rotates no pair
    ("sliding_window", dict(sliding_window=0)),
    ("activation", dict(activation="relu")),
    ("layer_types", dict(layer_types=("full_attention",))),  # one of two layers
    ("layer_types", dict(layer_types=("full_attention", "sliding_attention"))),  # no window
    ("rope_local_theta", dict(rope_local_theta=0.0)),
    ("query_pre_attn_scalar", dict(query_pre_attn_scalar=-1.0)),
    ("attn_logit_softcapping", dict(attn_logit_softcapping=True)),
    ("qk_norm", dict(qk_norm="rms")),
    ("norm_placement", dict(norm_placement="middle")),
    ("scan_layers", dict(scan_layers="yes")),
    ("param_dtype", dict(param_dtype="int8")),
    ("logprob_chunk", dict(logprob_chunk=-1)),
    ("attention_impl", dict(attention_impl="flash")),
    ("decode_attention", dict(decode_attention="cudnn")),
    ("num_experts", dict(num_experts=-1)),
    ("expert_kernel", dict(expert_kernel="triton")),
    ("experts_per_token", dict(MOE, experts_per_token=5)),
    ("expert_intermediate_size", dict(MOE, expert_intermediate_size=0)),
    ("dense_layers", dict(MOE, dense_layers=(2,))),
    ("scan_layers", dict(MOE, dense_layers=(0,), scan_layers=True)),
])
def test_each_refusal_is_one_line_naming_its_field(field, changes):
  with pytest.raises(ValueError, match=rf"^DecoderConfig\.{field}\b") as error:
    CONFIG.replace(**changes)
  assert "\n" not in str(error.value)


def test_per_layer_windows_local_rope_and_sparse_mlps():
  """Gemma 3's pattern (sliding layers with their own RoPE base, a full one) and Qwen3-MoE
  dense layers among sparse ones, as the docstring defines them."""
  gemma = CONFIG.replace(num_layers=3, sliding_window=4, rope_local_theta=10.0,
                         layer_types=("sliding_attention", "sliding_attention",
                                      "full_attention"))
  assert [gemma.layer_window(i) for i in range(3)] == [4, 4, None]
  assert [gemma.layer_local_rope(i) for i in range(3)] == [True, True, False]
  everywhere = CONFIG.replace(sliding_window=4)  # no layer_types: every layer alike
  assert [everywhere.layer_window(i) for i in range(2)] == [4, 4]
  assert not any(everywhere.layer_local_rope(i) for i in range(2))
  moe = CONFIG.replace(num_layers=3, dense_layers=(1,), **MOE)
  assert [moe.sparse_layer(i) for i in range(3)] == [True, False, True]
  assert not any(CONFIG.sparse_layer(i) for i in range(2))


def test_rotary_dims_and_score_scale():
  assert CONFIG.rotary_dim == 8 and CONFIG.attention_scale is None
  assert CONFIG.replace(head_dim=12, partial_rotary_factor=0.5).rotary_dim == 6
  assert CONFIG.replace(query_pre_attn_scalar=24.0).attention_scale == pytest.approx(
      1 / 24 ** 0.5)


def test_precision_property():
  assert tiny_config().matmul_precision == "auto"
  assert tiny_config().precision == jax.lax.Precision.HIGHEST
  assert tiny_config(dtype="bfloat16").precision is None
  assert tiny_config(dtype="float16").precision is None
  assert tiny_config(matmul_precision="default").precision is None
  assert tiny_config(matmul_precision="high").precision == jax.lax.Precision.HIGH
  assert tiny_config(dtype="bfloat16", matmul_precision="highest").precision == (
      jax.lax.Precision.HIGHEST)


@pytest.mark.parametrize("bad", ["tf32", "HIGHEST", "", None])
def test_bad_matmul_precision_names_the_field(bad):
  with pytest.raises(ValueError, match=r"DecoderConfig\.matmul_precision.*auto.*highest"):
    tiny_config(matmul_precision=bad)


def test_num_params_matches_the_arrays():
  for config in (CONFIG, CONFIG.replace(tie_embeddings=True, qkv_bias=False)):
    _, params = models.init_model(config)
    assert sum(x.size for x in jax.tree.leaves(params)) == config.num_params()


@pytest.mark.parametrize("changes", [
    dict(qk_norm="head", qkv_bias=False),
    dict(qk_norm="projection", norm_placement="post"),
    dict(norm_placement="sandwich", norm_offset=1.0, tie_embeddings=True),
    dict(num_layers=3, dense_layers=(1,), **MOE),
], ids=["qk-norm-head", "qk-norm-projection", "sandwich", "moe"])
def test_num_params_counts_every_variant(changes):
  config = CONFIG.replace(**changes)
  _, abstract = models.init_model(config, abstract=True)
  assert sum(x.size for x in jax.tree.leaves(abstract)) == config.num_params()
