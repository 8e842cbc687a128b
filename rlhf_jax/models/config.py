"""The run config's `model` section: the policy checkpoint, its runtime numerics, and
the shape of a model from scratch (ml_collections; validated here, read by training/build)."""

from __future__ import annotations

import jax
import ml_collections

from rlhf_jax.config_errors import at_least
from rlhf_jax.config_errors import check_range
from rlhf_jax.config_errors import invalid
from rlhf_jax.config_errors import one_of
from rlhf_jax.models.decoder_config import ATTENTION_IMPLS
from rlhf_jax.models.decoder_config import DECODE_ATTENTION
from rlhf_jax.models.decoder_config import DTYPES
from rlhf_jax.models.decoder_config import DecoderConfig
from rlhf_jax.models.decoder_config import EXPERT_KERNELS
from rlhf_jax.models.decoder_config import MATMUL_PRECISIONS
from rlhf_jax.models.lora import PROJECTIONS
from rlhf_jax.registry import Checking
from rlhf_jax.registry import Section


def model_config() -> ml_collections.ConfigDict:
  """The `model` section with its defaults (a built-in task's run changes some:
  training/overlays.py's arith overlay)."""
  m = ml_collections.ConfigDict()
  m.checkpoint = ""  # HF directory of the initial policy; empty with data.task: <workdir>/sft.
  m.dtype = "float32"  # Trainer compute dtype (float32, bfloat16); params stay float32.
  # Matmul precision of the trainer's model: 'auto' (highest for float32, the backend
  # default for bfloat16), 'default' (TF32 on NVIDIA GPUs), 'high', 'highest'.
  m.matmul_precision = "auto"
  # Log-probs from the hidden states this many tokens at a time (models/lm_head.py):
  # [chunk, V] logits at a time instead of [B, R, V], forward and backward; 0 = unchunked.
  m.logprob_chunk = 1024
  # Attention kernels (models/attention/choice.py): training and scoring forwards ('auto':
  # cuDNN flash on an NVIDIA GPU, XLA elsewhere; 'xla', 'cudnn', 'pallas'), and a sampler's
  # one-token decode step ('auto': the Pallas ragged kernel on a GPU; 'xla', 'pallas').
  m.attention_impl = "auto"
  m.decode_attention = "auto"
  # A mixture-of-experts model's experts (models/moe/experts.py): 'auto' (ragged_dot on a
  # TPU, tiled elsewhere), 'ragged_dot', 'tiled', 'pallas' (GPU only; not yet measured on
  # one), 'dense'.
  m.expert_kernel = "auto"
  # Rematerialise each layer in the backward (less activation memory, ~1/3 more compute)
  # and what it keeps: a jax.checkpoint_policies name (nothing_saveable, dots_saveable, ...).
  m.remat = False
  m.remat_policy = "nothing_saveable"
  # Stack the layers' parameters and run them as one lax.scan (models/layer_scan.py):
  # compile time flat in depth; use with remat (the scan keeps every layer's activations).
  m.scan_layers = False
  # LoRA (models/lora.py): rank r of the adapters the policy (and critic) train instead of
  # their weights (0 = full fine-tuning); W + (alpha / r)·A@B on the target projections.
  m.lora_rank = 0
  m.lora_alpha = 32.0
  m.lora_targets = tuple(PROJECTIONS)  # any of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
  m.hidden_size = 128  # A model from scratch (no model.checkpoint): width.
  m.num_layers = 3  # A model from scratch: layers.
  m.num_heads = 4  # A model from scratch: query heads.
  return m


def validate_model_config(m: ml_collections.ConfigDict, *, from_scratch: bool) -> None:
  """`model.*`: dtypes, precisions, numerics options, and, `from_scratch` (no checkpoint,
  or a built-in task's warm start to train), the shape of the model made."""
  one_of("model.dtype", m.dtype, DTYPES)
  one_of("model.matmul_precision", m.matmul_precision, MATMUL_PRECISIONS)
  one_of("model.attention_impl", m.attention_impl, ATTENTION_IMPLS)
  one_of("model.decode_attention", m.decode_attention, DECODE_ATTENTION)
  one_of("model.expert_kernel", m.expert_kernel, EXPERT_KERNELS)
  if m.expert_kernel == "pallas" and jax.default_backend() != "gpu":
    # Off a GPU the Pallas kernel runs in interpret mode: correct, and far too slow to train.
    invalid("model.expert_kernel", m.expert_kernel, "the Pallas grouped GEMM needs a GPU "
            f"(this run's backend is {jax.default_backend()}); use auto or tiled")
  at_least(m, "model", ("hidden_size", "num_layers", "num_heads"))
  check_range("model.logprob_chunk", m.logprob_chunk, low=0)
  if not callable(getattr(jax.checkpoint_policies, m.remat_policy, None)):
    invalid("model.remat_policy", m.remat_policy, "must name a jax.checkpoint_policies "
            "policy (e.g. nothing_saveable, dots_saveable)")
  check_range("model.lora_rank", m.lora_rank, low=0)
  check_range("model.lora_alpha", m.lora_alpha, low=0, low_open=True)
  for name in m.lora_targets:
    if name not in PROJECTIONS:
      invalid("model.lora_targets", m.lora_targets, f"{name!r} is not a projection; allowed: "
              f"{', '.join(PROJECTIONS)}")
  if from_scratch:  # its heads split the width evenly
    head_dim = m.hidden_size // m.num_heads
    if m.hidden_size % m.num_heads or head_dim % 2:
      invalid("model.hidden_size", m.hidden_size, f"must be model.num_heads={m.num_heads} × "
              "an even head width (RoPE rotates pairs)")


def scratch_decoder(m: ml_collections.ConfigDict, *, vocab_size: int, max_positions: int):
  """The decoder of a model from scratch with the section's shape (`hidden_size`,
  `num_layers`, `num_heads`): GQA with half the heads as KV heads, an MLP 3× wide."""
  return DecoderConfig(
      vocab_size=vocab_size, hidden_size=m.hidden_size, num_layers=m.num_layers,
      num_heads=m.num_heads, num_kv_heads=max(1, m.num_heads // 2),
      head_dim=m.hidden_size // m.num_heads, intermediate_size=3 * m.hidden_size,
      max_position_embeddings=max_positions)


def model_layout(m: ml_collections.ConfigDict) -> dict:
  """The policy's parameter layout options (`load_hf_checkpoint` overrides)."""
  return dict(scan_layers=m.scan_layers)


def model_numerics(m: ml_collections.ConfigDict) -> dict:
  """The trainer's runtime numerics from the `model` section (`with_numerics` fields)."""
  return dict(dtype=m.dtype, matmul_precision=m.matmul_precision,
              logprob_chunk=m.logprob_chunk, remat=m.remat, remat_policy=m.remat_policy,
              attention_impl=m.attention_impl, decode_attention=m.decode_attention,
              expert_kernel=m.expert_kernel)


def check_model_section(c: ml_collections.ConfigDict, checking: Checking) -> None:
  """The trainer's `model` section: a model is made from scratch without a checkpoint, or
  when a built-in task's warm start trains one (`data.task`)."""
  del checking
  validate_model_config(c.model, from_scratch=not c.model.checkpoint or bool(c.data.task))


SECTION = Section("model", at="model", fields=model_config, check=check_model_section,
                  after=("task",))
