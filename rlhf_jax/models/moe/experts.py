"""The experts of a mixture-of-experts layer: each token's k gated MLPs, combined by its gate
weights.

    out[n] = Σ_j w[n, j] · down_e (glu(x[n] @ gate_e, x[n] @ up_e)),  e = experts[n, j]

with glu(g, u) = act(g) · u (SwiGLU: act = silu), or gpt-oss's clamped SwiGLU,
glu(g, u) = min(g, l) · σ(α · min(g, l)) · (clip(u, -l, l) + 1) with α = 1.702, l = 7
(transformers' `GptOssExperts`); gpt-oss's experts also carry biases on each projection.

Kernels (`EXPERT_KERNELS`):
- "ragged_dot": dropless grouped GEMMs. The N·k (token, slot) pairs are sorted by expert,
  each expert's contiguous rows multiply its own weights in one `jax.lax.ragged_dot` (no
  capacity factor, no dropped tokens, no padding per expert), and the rows are scattered
  back and summed with their weights. Work is N·k rows, whatever the balance.
- "dense": every expert on every token, masked by the gate weights: X/k times the work of
  "ragged_dot", one einsum each; the reference for tiny models and tests.
"auto" is "ragged_dot".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlhf_jax.models.moe.routing import Routes

EXPERT_KERNELS = ("auto", "ragged_dot", "dense")
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
  if kernel == "dense":
    return _dense(x, routes, gate, up, down, glu, precision, biases)
  return _ragged(x, routes, gate, up, down, glu, precision, biases)


def _ragged(x, routes, gate, up, down, glu, precision, biases):
  n, k = routes.experts.shape
  num_experts = gate.shape[0]
  flat = routes.experts.reshape(-1)  # [N·k], pair p = token p // k, slot p % k
  order = jnp.argsort(flat, stable=True)  # pairs grouped by expert, tokens in order
  tokens = order // k
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  rows = x[tokens]  # [N·k, E]
  g = jax.lax.ragged_dot(rows, gate, sizes, precision=precision)
  u = jax.lax.ragged_dot(rows, up, sizes, precision=precision)
  if biases is not None:
    expert = flat[order]  # the expert of each sorted row
    g, u = g + biases[0][expert].astype(g.dtype), u + biases[1][expert].astype(u.dtype)
  out = jax.lax.ragged_dot(glu(g, u).astype(x.dtype), down, sizes, precision=precision)
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
