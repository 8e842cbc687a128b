"""The experts of a mixture-of-experts layer: each token's k gated MLPs, combined by its gate
weights.

    out[n] = Σ_j w[n, j] · down_e (glu(x[n] @ gate_e, x[n] @ up_e)),  e = experts[n, j]

with glu(g, u) = act(g) · u (SwiGLU: act = silu), or gpt-oss's clamped SwiGLU,
glu(g, u) = min(g, l) · σ(α · min(g, l)) · (clip(u, -l, l) + 1) with α = 1.702, l = 7
(transformers' `GptOssExperts`); gpt-oss's experts also carry biases on each projection.

Kernels (`EXPERT_KERNELS`): all but "dense" are dropless grouped GEMMs. The N·k (token,
slot) pairs are sorted by expert, each expert's contiguous rows multiply its own weights
(no capacity factor, no dropped tokens), and the rows are scattered back and summed with
their weights; the grouped matmul (`jax.lax.ragged_dot`'s contract) is
- "ragged_dot": `jax.lax.ragged_dot` (no padding per expert; work N·k rows whatever the
  balance);
- "tiled": ours in XLA (`grouped.grouped_matmul`): each expert's rows padded to a tile of
  64, one batched matmul per chunk of tiles; every backend;
- "pallas": ours as a Pallas kernel (`pallas_grouped.grouped_matmul`, megablox-style
  tiles; Triton on a GPU, interpret mode elsewhere: correct and slow, for tests);
- "dense": every expert on every token, masked by the gate weights: X/k times the work of
  the others, one einsum each; the reference for tiny models and tests.
"auto" is resolved by `resolve_kernel`, the one place that picks per backend.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlhf_jax.models.moe import grouped
from rlhf_jax.models.moe import pallas_grouped
from rlhf_jax.models.moe.routing import Routes

EXPERT_KERNELS = ("auto", "ragged_dot", "tiled", "pallas", "dense")
ACTIVATIONS = {"silu": jax.nn.silu,
               "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True)}
GLUS = tuple(ACTIVATIONS) + ("clamped_swiglu",)


def clamped_swiglu(gate: jax.Array, up: jax.Array, *, alpha: float = 1.702,
                   limit: float = 7.0) -> jax.Array:
  """gpt-oss's gated unit: g = min(gate, limit), g·σ(α·g) · (clip(up, ±limit) + 1)."""
  gate = jnp.minimum(gate, limit)
  return gate * jax.nn.sigmoid(alpha * gate) * (jnp.clip(up, -limit, limit) + 1)


def _glu(activation: str, swiglu_alpha: float, swiglu_limit: float):
  if activation == "clamped_swiglu":
    return lambda g, u: clamped_swiglu(g, u, alpha=swiglu_alpha, limit=swiglu_limit)
  act = ACTIVATIONS[activation]
  return lambda g, u: act(g) * u


def resolve_kernel(kernel: str) -> str:
  """The experts' kernel for `kernel`, "auto" turned into one for the backend the program
  is traced for (`jax.default_backend()`); the others are taken as given.

  "auto": on a TPU "ragged_dot" (XLA:TPU lowers it to a grouped matmul of its own, and the
  Pallas kernel here is Triton's); elsewhere "tiled": on a CPU, XLA:CPU's `ragged_dot` took
  5.4 s for a forward that a batched matmul does in 0.036 s, and 10-20 GB, and the tiled
  layer's forward and backward was 13.6× faster than "dense" (docs/moe.md); on a GPU,
  upstream `ragged_dot` falls back to a dense computation (about 23 TF/s on a B200, as the
  marin project measured it), and "pallas" has run only in interpret mode so far: it
  becomes the GPU's "auto" once `scripts/gpu_check.sh run env moe_layer` has measured it.
  """
  if kernel != "auto":
    return kernel
  return "ragged_dot" if jax.default_backend() == "tpu" else "tiled"


def expert_mlp(x: jax.Array, routes: Routes, gate: jax.Array, up: jax.Array, down: jax.Array,
               *, kernel: str = "auto", activation: str = "silu",
               precision: jax.lax.Precision | None = None,
               biases: tuple[jax.Array, jax.Array, jax.Array] | None = None,
               swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0) -> jax.Array:
  """The routed experts' gated MLPs of tokens x [N, E], combined by the gate weights.

  Args:
    x: [N, E] token activations.
    routes: experts [N, k] and weights [N, k] (`routing.route`).
    gate: [X, E, F] each expert's gate projection.
    up: [X, E, F] each expert's up projection.
    down: [X, F, E] each expert's down projection.
    kernel: one of EXPERT_KERNELS.
    activation: the gated unit, one of GLUS ("silu": SwiGLU; "clamped_swiglu": gpt-oss's).
    precision: the matmuls' precision (`DecoderConfig.precision`).
    biases: (gate [X, F], up [X, F], down [X, E]) each expert's projection biases
      (gpt-oss), or None.
    swiglu_alpha: α of "clamped_swiglu".
    swiglu_limit: l of "clamped_swiglu".
  Returns:
    [N, E] in x's dtype.
  """
  if kernel not in EXPERT_KERNELS:
    raise ValueError(f"expert kernel {kernel!r}; allowed: {', '.join(EXPERT_KERNELS)}")
  if activation not in GLUS:
    raise ValueError(f"expert activation {activation!r}; allowed: {', '.join(GLUS)}")
  glu = _glu(activation, swiglu_alpha, swiglu_limit)
  kernel = resolve_kernel(kernel)
  if kernel == "dense":
    return _dense(x, routes, gate, up, down, glu, precision, biases)
  matmul = {"ragged_dot": jax.lax.ragged_dot, "tiled": grouped.grouped_matmul,
            "pallas": pallas_grouped.grouped_matmul}[kernel]
  return _sorted(x, routes, gate, up, down, glu, biases,
                 lambda rows, weights, sizes: matmul(rows, weights, sizes, precision=precision))


def _sorted(x, routes, gate, up, down, glu, biases, matmul):
  """The grouped-GEMM kernels: pairs sorted by expert, `matmul(rows, weights, sizes)` per
  projection (`jax.lax.ragged_dot`'s contract), scattered back with their gate weights."""
  n, k = routes.experts.shape
  num_experts = gate.shape[0]
  flat = routes.experts.reshape(-1)  # [N·k], pair p = token p // k, slot p % k
  order = jnp.argsort(flat, stable=True)  # pairs grouped by expert, tokens in order
  tokens = order // k
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  rows = x[tokens]  # [N·k, E]
  g = matmul(rows, gate, sizes)
  u = matmul(rows, up, sizes)
  if biases is not None:
    expert = flat[order]  # the expert of each sorted row
    g, u = g + biases[0][expert].astype(g.dtype), u + biases[1][expert].astype(u.dtype)
  out = matmul(glu(g, u).astype(x.dtype), down, sizes)
  if biases is not None:
    out = out + biases[2][expert].astype(out.dtype)
  weights = routes.weights.reshape(-1)[order].astype(out.dtype)
  return jnp.zeros((n, x.shape[-1]), out.dtype).at[tokens].add(out * weights[:, None]).astype(
      x.dtype)


def _dense(x, routes, gate, up, down, glu, precision, biases):
  num_experts = gate.shape[0]
  # [N, X]: token n's weight on expert x (0 when x is not among its k)
  combine = jnp.einsum("nk,nkx->nx", routes.weights,
                       jax.nn.one_hot(routes.experts, num_experts, dtype=routes.weights.dtype))
  g = jnp.einsum("ne,xef->nxf", x, gate, precision=precision)
  u = jnp.einsum("ne,xef->nxf", x, up, precision=precision)
  if biases is not None:
    g, u = g + biases[0][None].astype(g.dtype), u + biases[1][None].astype(u.dtype)
  out = jnp.einsum("nxf,xfe->nxe", glu(g, u).astype(x.dtype), down, precision=precision)
  if biases is not None:
    out = out + biases[2][None].astype(out.dtype)
  return jnp.einsum("nxe,nx->ne", out, combine.astype(out.dtype)).astype(x.dtype)
