"""Decoder configuration: the shape, family options and runtime numerics of a decoder LM
(its mapping to HF `config.json` is `hf.config`)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
                 "phi3": "Phi3ForCausalLM", "mistral": "MistralForCausalLM",
                 "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM"}
DTYPES = ("float32", "bfloat16", "float16")
MATMUL_PRECISIONS = ("auto", "default", "high", "highest")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "pallas")
DECODE_ATTENTION = ("auto", "xla", "pallas")
QK_NORMS = ("none", "head", "projection")
NORM_PLACEMENTS = ("pre", "post", "sandwich")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "clamped_swiglu")
LAYER_TYPES = ("full_attention", "sliding_attention")
EXPERT_KERNELS = ("auto", "ragged_dot", "tiled", "pallas", "dense")  # models/moe/experts.py


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3 RoPE frequency scaling (HF `rope_type="llama3"`)."""
  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class YarnScaling:
  """YaRN RoPE scaling (Peng et al. 2023; HF `rope_type="yarn"`, as transformers'
  `_compute_yarn_parameters`): frequencies blended between interpolated (/ factor) and
  extrapolated by a linear ramp over the dims between the correction range of `beta_fast`
  and `beta_slow` rotations, and cos/sin multiplied by `attention_factor`."""
  factor: float
  original_max_position_embeddings: int
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attention_factor: float = 1.0  # resolved from factor (0.1·ln(factor) + 1) when unset
  truncate: bool = True  # floor / ceil the correction range (gpt-oss: False)


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """Shape and numerics of a decoder-only LM.

  Attributes:
    architecture: the HF family the checkpoint is written as: "qwen2" (q/k/v
      bias), "llama", "qwen3" (q/k norms per head), "olmo2" (post-norm blocks, q/k
      norms over the projection), "phi3" (fused qkv / gate_up tensors in the
      checkpoint, split here), "mistral" (sliding window), "gemma2" (sandwich norms,
      soft-capping, alternating sliding layers), "gemma3_text" (Gemma 3's text model:
      q/k norms, a RoPE base per layer type), "qwen3_moe" (Qwen3 with mixture-of-experts
      MLPs), "gpt_oss" (gpt-oss: sinks, biases, clamped experts); see ARCHITECTURES.
    vocab_size: tokens in the vocabulary.
    hidden_size: the residual width.
    num_layers: decoder layers.
    num_heads: query heads; a multiple of num_kv_heads (grouped-query attention).
    num_kv_heads: key/value heads.
    head_dim: width of one head.
    intermediate_size: the gated MLP's hidden width.
    activation: the gate's activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU
      with the tanh approximation, Gemma), or "clamped_swiglu" (gpt-oss, experts only:
      g·σ(1.702·g)·(clip(u, ±l) + 1), g = min(gate, l), l = swiglu_limit).
    rms_norm_eps: RMSNorm epsilon.
    rope_theta: RoPE base.
    rope_scaling: Llama 3 (RopeScaling) or YaRN (YarnScaling) frequency scaling, or
      None.
    rope_local_theta: the RoPE base of sliding-window layers (Gemma 3's
      `rope_local_base_freq`); None: rope_theta in every layer.
    partial_rotary_factor: the share of each head's dims RoPE rotates (Phi-3 /
      Phi-4-mini): the first int(head_dim · factor) (`rotary_dim`); the rest pass
      through unrotated. 1.0: all.
    sliding_window: a query attends to itself and the window − 1 real tokens
      before it (HF: key index > query index − window), in every layer; None: to
      all earlier tokens. Counted over real tokens, so padding and the gaps of a
      cache never shorten it. The KV cache still holds every slot (no ring buffer).
    layer_types: per layer, "full_attention" or "sliding_attention" (the window
      applies to sliding layers only: Gemma's interleaved layers); None: every layer
      alike (sliding_window, when set, in all).
    max_position_embeddings: longest supported position.
    qkv_bias: bias on the q/k/v projections (Qwen2: True).
    attention_out_bias: bias on the attention's output projection (gpt-oss).
    attention_sinks: a learned per-head logit in each softmax's denominator (gpt-oss `sinks`).
    qk_norm: RMSNorm of queries and keys before RoPE: "none"; "head" (Qwen3:
      each head's [head_dim] vector, one weight of [head_dim] for q and one for k);
      "projection" (OLMo 2: the whole projected q [num_heads·head_dim] and k
      [num_kv_heads·head_dim] of a token, weights [heads, head_dim]).
    norm_placement: where a block's two RMSNorms sit: "pre" (Llama: x + attn(norm(x)),
      then x + mlp(norm(x))) or "post" (OLMo 2: x + norm(attn(x)), then
      x + norm(mlp(x)); no norm on a block's input) or "sandwich" (Gemma: four norms,
      x + norm(attn(norm(x))), then x + norm(mlp(norm(x)))).
    norm_offset: every RMSNorm multiplies by (offset + w): 1.0 for Gemma, whose norm
      weights are stored as w − 1 (and which computes the product in float32).
    scale_embeddings: multiply the embeddings by √hidden_size rounded to the compute
      dtype, as transformers rounds it to the model's dtype (Gemma; 34.0 for width 1152
      in bfloat16).
    query_pre_attn_scalar: attention scores are q·k / √query_pre_attn_scalar
      (Gemma); None: / √head_dim.
    attn_logit_softcapping: attention scores become c·tanh(s / c) before the mask
      (Gemma 2; c = 50); None: uncapped.
    final_logit_softcapping: the LM head's logits become c·tanh(z / c) (Gemma 2;
      c = 30), also in chunked log-probs; None: uncapped.
    tie_embeddings: the LM head reuses the input embedding.
    param_dtype: storage dtype of parameters.
    dtype: compute dtype of activations (RMSNorm, softmax and log-probs run
      in float32 regardless).
    remat: rematerialise each layer in the backward pass (`jax.checkpoint`).
    remat_policy: what a rematerialised layer keeps, a `jax.checkpoint_policies`
      name: "nothing_saveable" (recompute everything: least memory),
      "dots_saveable" / "dots_with_no_batch_dims_saveable" (keep matmul outputs,
      recompute elementwise ops), "everything_saveable".
    scan_layers: store the layers' parameters stacked on a leading [L] axis
      (logical axis "layers", never sharded) and run them as one `lax.scan`
      over a single traced block, so compile time does not grow with depth;
      remat / remat_policy then apply to the scanned block, and the KV cache
      holds [L, ...] arrays (`rlhf_jax.models.layer_scan`). Pair it with remat
      for training: a scan without remat keeps every layer's residuals stacked
      (benchmarks/compile_time.py, 0.5B at 16 × 1024 on CPU: 107 GiB of
      temporaries vs 79 unscanned; 27 with remat). False: a Python loop over
      per-layer parameters (`params["layers"][i]`). Not part of HF
      `config.json`; `layer_scan.stack_layer_params` converts between layouts.
    matmul_precision: the `jax.lax.Precision` of every matmul / einsum of the
      model (projections, attention forward and its hand-written backward,
      heads); see `precision`. Not part of HF `config.json`.
      "highest": true float32 products (on GPU ~several-fold slower float32
        GEMMs than TF32); a sampler and a trainer running the same float32
        model agree to float32 rounding (and match HF/PyTorch float32).
      "high": bf16x3 on TPU; TF32 on GPU (a 10-bit mantissa).
      "default": the backend default. On NVIDIA GPUs float32 matmuls then
        run in TF32 (10-bit mantissa): relative differences ~1e-3 per
        product, ~1e-4 in log-probs between programs that compile
        differently (sampler vs trainer, JAX vs HF). With bfloat16 compute it
        is the native bf16 tensor-core / MXU rate.
      "auto" (default): "highest" when `dtype` is float32 (asking for float32
        means asking for float32 numerics), else "default" (bf16 rate).
      On CPU all four compute the same true float32 products.
    logprob_chunk: tokens per chunk when log-probs of given tokens are computed
      from the hidden states (`rlhf_jax.models.lm_head`): the LM head's [chunk, V]
      logits are made one chunk at a time, forward and backward, instead of
      [B, T, V] at once; 0 = unchunked. Not part of HF `config.json`.
    attention_impl: the kernel of the uncached attention of training and scoring
      forwards (`grouped_query_attention`): "auto" (default; resolved by
      `attention.choice.training_attention`: cuDNN flash on an NVIDIA Hopper GPU, the
      Pallas kernel for bf16/fp16 where cuDNN cannot, XLA for float32 and off
      NVIDIA GPUs), "xla" (scores materialised, hand-written backward), "cudnn"
      (cuDNN's fused flash attention, GPU only), "pallas" (the Pallas flash kernel:
      Triton on GPU, interpret mode elsewhere: slow, for tests). Not part of HF
      `config.json`.
    decode_attention: the kernel of a one-token cached step (`cached_attention`):
      "auto" (default; `attention.choice.decode_attention`: "pallas" on a GPU, "xla"
      elsewhere), "xla": plain XLA, every row reads the slots up to the longest
      row's (rounded up to a block); "pallas": the ragged Pallas kernel
      (`rlhf_jax.models.attention.pallas_decode`; Triton on GPU, interpret mode
      elsewhere: slow, for tests), each row reads only its own used slots.
      Not part of HF `config.json`.
    num_experts: experts of a mixture-of-experts MLP (X); 0: every MLP dense.
    experts_per_token: k, the experts each token is routed to.
    expert_intermediate_size: an expert's gated-MLP hidden width (HF
      `moe_intermediate_size`).
    normalize_expert_weights: the k router probabilities are renormalised to sum to one
      (HF `norm_topk_prob`).
    dense_layers: the layers whose MLP is dense among sparse ones (HF `mlp_only_layers`,
      and the layers `decoder_sparse_step` skips); every other layer's MLP is sparse.
    expert_biases: biases on the router's logits and every expert projection (gpt-oss).
    expert_kernel: how the experts run (`models.moe.experts`): dropless grouped GEMMs
      over tokens sorted by expert, by "ragged_dot" (`jax.lax.ragged_dot`), "tiled" (ours
      in XLA, every backend) or "pallas" (our Pallas kernel: Triton on a GPU, interpret
      mode elsewhere, for tests); "dense" (every expert on every token; the reference);
      "auto" (`moe.experts.resolve_kernel`: "ragged_dot" on a TPU, "tiled" elsewhere).
      Not part of HF `config.json`.
  """
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  architecture: Literal["qwen2", "llama", "qwen3", "olmo2", "phi3", "mistral", "gemma2",
                        "gemma3_text", "qwen3_moe", "gpt_oss"] = "qwen2"
  activation: str = "silu"
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | YarnScaling | None = None
  partial_rotary_factor: float = 1.0
  sliding_window: int | None = None
  layer_types: tuple[str, ...] | None = None
  rope_local_theta: float | None = None
  max_position_embeddings: int = 2048
  qkv_bias: bool = True
  attention_out_bias: bool = False
  attention_sinks: bool = False
  qk_norm: str = "none"
  norm_placement: str = "pre"
  norm_offset: float = 0.0
  scale_embeddings: bool = False
  query_pre_attn_scalar: float | None = None
  attn_logit_softcapping: float | None = None
  final_logit_softcapping: float | None = None
  tie_embeddings: bool = False
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: bool = False
  remat_policy: str = "nothing_saveable"
  scan_layers: bool = False
  matmul_precision: str = "auto"
  logprob_chunk: int = 0
  attention_impl: str = "auto"
  decode_attention: str = "auto"
  num_experts: int = 0
  experts_per_token: int = 0
  expert_intermediate_size: int = 0
  normalize_expert_weights: bool = False
  dense_layers: tuple[int, ...] = ()
  expert_biases: bool = False
  swiglu_limit: float = 7.0
  expert_kernel: str = "auto"

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "intermediate_size", "max_position_embeddings"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"DecoderConfig.{name}={value!r} must be a positive int.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"DecoderConfig.num_heads={self.num_heads} must be a multiple of "
                       f"num_kv_heads={self.num_kv_heads}.")
    if self.head_dim % 2:
      raise ValueError(f"DecoderConfig.head_dim={self.head_dim} must be even (RoPE pairs).")
    if self.architecture not in ARCHITECTURES:
      raise ValueError(f"DecoderConfig.architecture={self.architecture!r}; allowed: "
                       f"{', '.join(ARCHITECTURES)}.")
    if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim < 2 or self.rotary_dim % 2:
      raise ValueError(f"DecoderConfig.partial_rotary_factor={self.partial_rotary_factor!r} "
                       f"must be in (0, 1] and rotate an even number of head dims "
                       f"(head_dim={self.head_dim}).")
    if self.sliding_window is not None and (
        not isinstance(self.sliding_window, int) or isinstance(self.sliding_window, bool)
        or self.sliding_window < 1):
      raise ValueError(f"DecoderConfig.sliding_window={self.sliding_window!r} must be a "
                       "positive int or None.")
    self._check_gemma_fields()
    self._check_expert_fields()
    if self.qk_norm not in QK_NORMS:
      raise ValueError(f"DecoderConfig.qk_norm={self.qk_norm!r}; allowed: {', '.join(QK_NORMS)}.")
    if self.norm_placement not in NORM_PLACEMENTS:
      raise ValueError(f"DecoderConfig.norm_placement={self.norm_placement!r}; allowed: "
                       f"{', '.join(NORM_PLACEMENTS)}.")
    if not callable(getattr(jax.checkpoint_policies, self.remat_policy, None)):
      raise ValueError(f"DecoderConfig.remat_policy={self.remat_policy!r} is not a "
                       "jax.checkpoint_policies name (e.g. 'nothing_saveable', 'dots_saveable').")
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f"DecoderConfig.scan_layers={self.scan_layers!r} must be a bool.")
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"DecoderConfig.{name}={getattr(self, name)!r}; allowed: "
                         f"{', '.join(DTYPES)}.")
    if (not isinstance(self.logprob_chunk, int) or isinstance(self.logprob_chunk, bool)
        or self.logprob_chunk < 0):
      raise ValueError(f"DecoderConfig.logprob_chunk={self.logprob_chunk!r} must be an int "
                       "≥ 0 (0: unchunked).")
    if self.matmul_precision not in MATMUL_PRECISIONS:
      raise ValueError(f"DecoderConfig.matmul_precision={self.matmul_precision!r}; allowed: "
                       f"{', '.join(MATMUL_PRECISIONS)}.")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"DecoderConfig.attention_impl={self.attention_impl!r}; allowed: "
                       f"{', '.join(ATTENTION_IMPLS)}.")
    if self.attention_sinks and self.attention_impl == "cudnn":  # cuDNN's call has none
      raise ValueError("DecoderConfig.attention_impl='cudnn' cannot compute attention_sinks.")
    if self.decode_attention not in DECODE_ATTENTION:
      raise ValueError(f"DecoderConfig.decode_attention={self.decode_attention!r}; allowed: "
                       f"{', '.join(DECODE_ATTENTION)}.")

  def _check_expert_fields(self) -> None:
    """The experts' sizes, the dense layers, and a scan over alike layers only."""
    for name in ("num_experts", "experts_per_token", "expert_intermediate_size"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"DecoderConfig.{name}={value!r} must be an int ≥ 0.")
    if self.expert_kernel not in EXPERT_KERNELS:
      raise ValueError(f"DecoderConfig.expert_kernel={self.expert_kernel!r}; allowed: "
                       f"{', '.join(EXPERT_KERNELS)}.")
    if not self.swiglu_limit > 0:  # NaN fails too
      raise ValueError(f"DecoderConfig.swiglu_limit={self.swiglu_limit!r} must be > 0.")
    if self.activation == "clamped_swiglu" and (not self.num_experts or self.dense_layers):
      raise ValueError(f"DecoderConfig.activation='clamped_swiglu' is for experts only; "
                       f"num_experts={self.num_experts}, dense_layers={self.dense_layers}.")
    if not self.num_experts:
      return
    if not 1 <= self.experts_per_token <= self.num_experts:
      raise ValueError(f"DecoderConfig.experts_per_token={self.experts_per_token!r} must be "
                       f"in [1, num_experts={self.num_experts}].")
    if self.expert_intermediate_size < 1:
      raise ValueError(f"DecoderConfig.expert_intermediate_size="
                       f"{self.expert_intermediate_size!r} must be ≥ 1 with experts.")
    if (not isinstance(self.dense_layers, tuple)
        or any(not isinstance(i, int) or not 0 <= i < self.num_layers
               for i in self.dense_layers)):
      raise ValueError(f"DecoderConfig.dense_layers={self.dense_layers!r} must be a tuple of "
                       f"layer indices in [0, {self.num_layers}).")
    if self.scan_layers and 0 < len(set(self.dense_layers)) < self.num_layers:
      raise ValueError(f"DecoderConfig.scan_layers=True needs every layer alike; "
                       f"dense_layers={self.dense_layers} mixes dense and sparse MLPs.")

  def sparse_layer(self, layer: int) -> bool:
    """Whether layer `layer`'s MLP is a mixture of experts."""
    return self.num_experts > 0 and layer not in self.dense_layers

  def _check_gemma_fields(self) -> None:
    """The activation, per-layer types and the scalars of Gemma's options."""
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"DecoderConfig.activation={self.activation!r}; allowed: "
                       f"{', '.join(ACTIVATIONS)}.")
    if self.layer_types is not None:
      if (not isinstance(self.layer_types, tuple) or len(self.layer_types) != self.num_layers
          or not set(self.layer_types) <= set(LAYER_TYPES)):
        raise ValueError(f"DecoderConfig.layer_types={self.layer_types!r} must be a tuple of "
                         f"num_layers={self.num_layers} of {', '.join(LAYER_TYPES)}.")
      if "sliding_attention" in self.layer_types and self.sliding_window is None:
        raise ValueError("DecoderConfig.layer_types has sliding layers but sliding_window "
                         "is None.")
    for name in ("rope_local_theta", "query_pre_attn_scalar", "attn_logit_softcapping",
                 "final_logit_softcapping"):
      value = getattr(self, name)
      if value is not None and (isinstance(value, bool) or not value > 0):
        raise ValueError(f"DecoderConfig.{name}={value!r} must be a positive number or None.")

  def layer_window(self, layer: int) -> int | None:
    """The sliding window of layer `layer` (None: it attends to all earlier tokens)."""
    if self.layer_types is not None and self.layer_types[layer] == "full_attention":
      return None
    return self.sliding_window

  def layer_local_rope(self, layer: int) -> bool:
    """Whether layer `layer` rotates with `rope_local_theta` (a sliding layer of Gemma 3)."""
    return self.rope_local_theta is not None and self.layer_window(layer) is not None

  @property
  def attention_scale(self) -> float | None:
    """The factor of q·k in the scores when not 1/√head_dim (`query_pre_attn_scalar`);
    None: 1/√head_dim."""
    return None if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar ** -0.5

  @property
  def precision(self) -> jax.lax.Precision | None:
    """The `jax.lax.Precision` every model matmul runs at; None = the backend default.

    "auto" → HIGHEST when `dtype` is float32, else None; "default" → None;
    "high" → HIGH; "highest" → HIGHEST (see the class docstring for costs).
    """
    if self.matmul_precision == "auto":
      return jax.lax.Precision.HIGHEST if self.dtype == "float32" else None
    return {"default": None, "high": jax.lax.Precision.HIGH,
            "highest": jax.lax.Precision.HIGHEST}[self.matmul_precision]

  @property
  def rotary_dim(self) -> int:
    """Head dims RoPE rotates: int(head_dim · partial_rotary_factor), as transformers."""
    return int(self.head_dim * self.partial_rotary_factor)

  @property
  def jnp_dtype(self):
    """The compute dtype as a numpy dtype."""
    return jnp.dtype(self.dtype)

  @property
  def jnp_param_dtype(self):
    """The parameter dtype as a numpy dtype."""
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes) -> "DecoderConfig":
    """A copy with `changes` applied (validated again)."""
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """Parameter count of the LM (tied embedding counted once)."""
    e, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    attention = e * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
    if self.qkv_bias:
      attention += self.head_dim * (self.num_heads + 2 * self.num_kv_heads)
    attention += e * self.attention_out_bias + self.num_heads * self.attention_sinks
    if self.qk_norm == "head":
      attention += 2 * self.head_dim
    elif self.qk_norm == "projection":
      attention += self.head_dim * (self.num_heads + self.num_kv_heads)
    norms = 4 if self.norm_placement == "sandwich" else 2
    experts = self.num_experts * 3 * e * self.expert_intermediate_size + e * self.num_experts
    experts += self.expert_biases * self.num_experts * (1 + 2 * self.expert_intermediate_size + e)
    mlps = sum(experts if self.sparse_layer(i) else 3 * e * f for i in range(self.num_layers))
    head = 0 if self.tie_embeddings else e * v
    return v * e + self.num_layers * (attention + norms * e) + mlps + e + head
