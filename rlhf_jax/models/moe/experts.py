"""The experts of a mixture-of-experts layer: each token's k gated MLPs, combined by its gate
weights.

    out[n] = Σ_j w[n, j] · down_e (act(x[n] @ gate_e) * (x[n] @ up_e)),  e = experts[n, j]

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


def expert_mlp(x: jax.Array, routes: Routes, gate: jax.Array, up: jax.Array, down: jax.Array,
               *, kernel: str = "auto", activation: str = "silu",
               precision: jax.lax.Precision | None = None) -> jax.Array:
  """The routed experts' gated MLPs of tokens x [N, E], combined by the gate weights.

  Args:
    x: [N, E] token activations.
    routes: experts [N, k] and weights [N, k] (`routing.route`).
    gate: [X, E, F] each expert's gate projection.
    up: [X, E, F] each expert's up projection.
    down: [X, F, E] each expert's down projection.
    kernel: one of EXPERT_KERNELS.
    activation: the gate's activation ("silu": SwiGLU).
    precision: the matmuls' precision (`DecoderConfig.precision`).
  Returns:
    [N, E] in x's dtype.
  """
  if kernel not in EXPERT_KERNELS:
    raise ValueError(f"expert kernel {kernel!r}; allowed: {', '.join(EXPERT_KERNELS)}")
  act = ACTIVATIONS[activation]
  if kernel == "dense":
    return _dense(x, routes, gate, up, down, act, precision)
  return _ragged(x, routes, gate, up, down, act, precision)


def _ragged(x, routes, gate, up, down, act, precision):
  n, k = routes.experts.shape
  num_experts = gate.shape[0]
  flat = routes.experts.reshape(-1)  # [N·k], pair p = token p // k, slot p % k
  order = jnp.argsort(flat, stable=True)  # pairs grouped by expert, tokens in order
  tokens = order // k
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  rows = x[tokens]  # [N·k, E]
  hidden = act(jax.lax.ragged_dot(rows, gate, sizes, precision=precision)) * (
      jax.lax.ragged_dot(rows, up, sizes, precision=precision))
  out = jax.lax.ragged_dot(hidden.astype(x.dtype), down, sizes, precision=precision)
  weights = routes.weights.reshape(-1)[order].astype(out.dtype)
  return jnp.zeros((n, x.shape[-1]), out.dtype).at[tokens].add(out * weights[:, None]).astype(
      x.dtype)


def _dense(x, routes, gate, up, down, act, precision):
  num_experts = gate.shape[0]
  # [N, X]: token n's weight on expert x (0 when x is not among its k)
  combine = jnp.einsum("nk,nkx->nx", routes.weights,
                       jax.nn.one_hot(routes.experts, num_experts, dtype=routes.weights.dtype))
  hidden = act(jnp.einsum("ne,xef->nxf", x, gate, precision=precision)) * jnp.einsum(
      "ne,xef->nxf", x, up, precision=precision)
  out = jnp.einsum("nxf,xfe->nxe", hidden.astype(x.dtype), down, precision=precision)
  return jnp.einsum("nxe,nx->ne", out, combine.astype(out.dtype)).astype(x.dtype)
