"""Which attention kernel runs where: the one place "auto" is resolved.

`DecoderConfig.attention_impl` (training and scoring forwards) and
`DecoderConfig.decode_attention` (one-token cached steps) accept "auto"; the
functions here turn it into a concrete kernel for the backend the program is
traced for (`jax.default_backend()`), so a config written on a laptop runs the
fused kernels on a GPU without edits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlhf_jax.models.attention import cudnn as cudnn_attention
from rlhf_jax.models.attention import pallas_flash as flash_attention


def on_gpu() -> bool:
  """Whether programs are traced for a GPU (CUDA or ROCm: both run Pallas' Triton
  kernels; elsewhere the Pallas kernels run in interpret mode)."""
  return jax.default_backend() == "gpu"


def _on_nvidia_gpu() -> bool:
  return on_gpu() and "cuda" in str(getattr(jax.devices()[0].client, "platform_version",
                                            "")).lower()


def _cudnn_hopper() -> bool:
  """Whether the first GPU is an NVIDIA Hopper or later (cuDNN's packed form needs
  sm_90)."""
  capability = getattr(jax.devices()[0], "compute_capability", None)
  try:
    return capability is not None and float(capability) >= 9.0
  except ValueError:  # not an NVIDIA capability ("gfx90a" on ROCm)
    return False


def training_attention(impl: str, *, dtype=None, head_dim: int | None = None,
                       time: int | None = None, softcap: float | None = None,
                       window=None, sinks: bool = False) -> str:
  """The kernel of `grouped_query_attention` for `impl` ("auto" | "xla" | "cudnn" |
  "pallas"); the others are taken as given (and refuse what they cannot do).

  "auto": "xla" off NVIDIA GPUs (CPU, TPU; interpret mode would be slow). On an
  NVIDIA GPU, given the attention (compute `dtype`, `head_dim`, sequence length
  `time`, `softcap`, `window`, attention `sinks`): "cudnn" (fused flash attention,
  FlashAttention-2 as cuDNN builds it) on Hopper or later when `cudnn_attention.refusal`
  finds nothing (never with sinks: gpt-oss goes to "pallas" or "xla"),
  else for bf16/fp16 "pallas" (the Triton flash kernel: any length and head size)
  when there is no softcap or narrow window, else "xla" (float32 too: the Triton
  kernel's float32 products are TF32, below `DecoderConfig.precision`). Without the attention (`dtype` None) on a
  GPU it stays "auto", for `grouped_query_attention` to call this again with its
  arrays.
  """
  if impl != "auto":
    return impl
  if not _on_nvidia_gpu():
    return "xla"
  if dtype is None:
    return "auto"
  if _cudnn_hopper() and cudnn_attention.refusal(dtype, head_dim, time, softcap,
                                                 window, sinks) is None:
    return "cudnn"
  if jnp.dtype(dtype).itemsize > 2:  # Triton's float32 dots are TF32: keep `precision`
    return "xla"
  try:
    flash_attention.check_options("pallas", time, softcap, window)
  except ValueError:
    return "xla"
  return "pallas"


def decode_attention(kernel: str) -> str:
  """The kernel of a one-token cached step for `kernel` ("auto" | "xla" | "pallas"):
  "auto" is "pallas" on a GPU (the ragged decode kernel: no per-layer conditional in
  the step) and "xla" elsewhere (on CPU the XLA path is faster than interpret mode)."""
  if kernel != "auto":
    return kernel
  return "pallas" if on_gpu() else "xla"


def decode_span_switch() -> bool:
  """Whether the XLA decode path picks its read span with a per-layer `lax.switch`
  (`cached_attention`): on CPU (and TPU) a conditional is cheap and skips the empty end of
  the cache; on a GPU each conditional is a host synchronisation that also cuts CUDA-graph
  capture (XLA's ConditionalThunk), far dearer than reading every slot, so it reads all."""
  return not on_gpu()
