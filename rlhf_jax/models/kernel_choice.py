"""Which attention kernel runs where: the one place "auto" is resolved.

`DecoderConfig.attention_impl` (training and scoring forwards) and
`DecoderConfig.decode_attention` (one-token cached steps) accept "auto"; the
functions here turn it into a concrete kernel for the backend the program is
traced for (`jax.default_backend()`), so a config written on a laptop runs the
fused kernels on a GPU without edits.
"""

from __future__ import annotations

import jax


def _on_gpu() -> bool:
  return jax.default_backend() in ("gpu", "cuda", "rocm")


def training_attention(impl: str) -> str:
  """The kernel of `grouped_query_attention` for `impl` ("auto" | "xla" | "cudnn" |
  "pallas"): "auto" is "cudnn" on an NVIDIA GPU (cuDNN's fused flash attention) and
  "xla" elsewhere (CPU, TPU); the others are taken as given."""
  if impl != "auto":
    return impl
  return "cudnn" if jax.default_backend() in ("gpu", "cuda") else "xla"


def decode_attention(kernel: str) -> str:
  """The kernel of a one-token cached step for `kernel` ("auto" | "xla" | "pallas"):
  "auto" is "pallas" on a GPU (the ragged decode kernel: no per-layer conditional in
  the step) and "xla" elsewhere (on CPU the XLA path is faster than interpret mode)."""
  if kernel != "auto":
    return kernel
  return "pallas" if _on_gpu() else "xla"
