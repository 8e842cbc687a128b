"""Token log-probabilities and entropy from logits, memory-aware.

Vocabularies are ~150k wide, so `[B, T, V]` float32 temporaries dominate
memory. Both functions upcast inside fused reductions only (XLA fuses the
convert into the reduce), and `token_logprobs` has a custom VJP whose backward
writes the single `[B, T, V]` cotangent directly in the logits' dtype instead
of autodiff's softmax + scattered one-hot + sum.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v


def _check_logits_tokens(logits, tokens):
  if jnp.ndim(logits) != jnp.ndim(tokens) + 1:
    raise ValueError(f"logits must have one more axis (vocab) than tokens; got "
                     f"logits {jnp.shape(logits)}, tokens {jnp.shape(tokens)}.")
  if jnp.shape(logits)[:-1] != jnp.shape(tokens):
    raise ValueError(f"logits {jnp.shape(logits)} and tokens {jnp.shape(tokens)} "
                     "disagree on the leading axes.")
  v.check_floating(logits, "logits")
  v.check_integer(tokens, "tokens")


def _scaled_logsumexp(logits: chex.Array, temperature: float) -> chex.Array:
  """log Σ_v exp(x_v/τ) in float32 without a float32 copy of the logits.

  The max is taken in the logits' own dtype (exact for any float dtype), so the
  upcast feeds a single fused reduction; `jax.nn.logsumexp` on upcast logits
  feeds two reductions and makes XLA materialise a float32 [.., V] buffer.
  """
  shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1).astype(jnp.float32) / temperature)
  shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
  total = jnp.sum(jnp.exp(logits.astype(jnp.float32) / temperature - shift[..., None]),
                  axis=-1)
  return shift + jnp.log(total)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _token_logprobs(logits, tokens, temperature):
  scaled_lse = _scaled_logsumexp(logits, temperature)
  picked = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
  return picked.astype(jnp.float32) / temperature - scaled_lse


def _token_logprobs_fwd(logits, tokens, temperature):
  out = _token_logprobs(logits, tokens, temperature)
  # Residual: the per-position logsumexp, [B, T] only (not the softmax).
  lse = (jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
         .astype(jnp.float32) / temperature - out)
  return out, (logits, tokens, lse)


def _token_logprobs_bwd(temperature, residuals, g):
  logits, tokens, lse = residuals
  # d/dlogits [x_k/τ − lse(x/τ)] = (onehot_k − softmax(x/τ)) / τ, one fused pass.
  probs = jnp.exp(logits.astype(jnp.float32) / temperature - lse[..., None])
  onehot = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == tokens[..., None]
  grad = (onehot.astype(jnp.float32) - probs) * (g / temperature)[..., None]
  return grad.astype(logits.dtype), None


_token_logprobs.defvjp(_token_logprobs_fwd, _token_logprobs_bwd)


def token_logprobs(logits: chex.Array, tokens: chex.Array, *,
                   temperature: float = 1.0) -> chex.Array:
  """log softmax(logits / τ)[token] for every position.

      log π(a_t|s_t) = x_{t,a_t}/τ − log Σ_v exp(x_{t,v}/τ)

  Logits must already be aligned with the tokens they score (logits at t−1
  predict token t: shift before calling).

  Args:
    logits: [..., V] float (bfloat16 or float32).
    tokens: [...] int token ids.
    temperature: τ > 0; the sampler's temperature when scoring its draws.
  Returns:
    [...] float32 log-probabilities.
  """
  _check_logits_tokens(logits, tokens)
  v.check_range("temperature", temperature, low=0.0, low_inclusive=False)
  return _token_logprobs(logits, tokens, temperature)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _entropy(logits, temperature):
  return _entropy_fwd(logits, temperature)[0]


def _shifted_scaled_logits(logits, shift, temperature):
  """z − max z = (x − max x)/τ in float32: the difference first (exact for nearby
  float32 logits), so rounding x/τ at |x| ~ 100 does not enter."""
  return (logits.astype(jnp.float32) - shift[..., None]) / temperature


def _entropy_fwd(logits, temperature):
  # H = lse − Σ p·z cancels two numbers of the logits' size (error ~1e-5 at
  # logits of 80); shifted by m = max x both stay of order one:
  #   z' = (x − m)/τ,  lse' = log Σ e^z',  p = e^(z' − lse'),  H = lse' − Σ p·z'.
  # The max is taken in the logits' own dtype (exact), as in `_scaled_logsumexp`.
  shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1).astype(jnp.float32))
  shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
  shifted_lse = jnp.log(jnp.sum(jnp.exp(_shifted_scaled_logits(logits, shift, temperature)),
                                axis=-1))
  # The barrier keeps XLA from sharing z' between the two sums: shared, XLA:CPU
  # materialises it as a [..., V] float32 buffer; rebuilt, each sum fuses its own
  # (a variadic reduce of both sums would too, but XLA:CPU sums it sequentially).
  logits_again, shift_again = jax.lax.optimization_barrier((logits, shift))
  z = _shifted_scaled_logits(logits_again, shift_again, temperature)
  entropy = shifted_lse - jnp.sum(jnp.exp(z - shifted_lse[..., None]) * z, axis=-1)
  # Residuals are [...] only (no softmax); the backward rebuilds log p from the
  # same shifted z', avoiding the cancellation there too.
  return entropy, (logits, shift, shifted_lse, entropy)


def _entropy_bwd(temperature, residuals, g):
  logits, shift, shifted_lse, entropy = residuals
  # ∂H/∂z_v = −p_v·(log p_v + H), z = x/τ: one fused pass, no saved softmax.
  log_probs = _shifted_scaled_logits(logits, shift, temperature) - shifted_lse[..., None]
  grad = -jnp.exp(log_probs) * (log_probs + entropy[..., None]) * (g / temperature)[..., None]
  return (grad.astype(logits.dtype),)


_entropy.defvjp(_entropy_fwd, _entropy_bwd)


def entropy_from_logits(logits: chex.Array, *, temperature: float = 1.0) -> chex.Array:
  """Entropy of softmax(logits / τ) at every position.

      H = log Σ_v e^{z_v} − Σ_v p_v·z_v,   z = x/τ, p = softmax(z)

  computed on z − max z, so large logits cost no precision (within 1e-6 of float64
  for H of 1–5 nats with logits up to ±240; unshifted it was off by up to 1e-3).

  Differentiable (custom VJP ∂H/∂z = −p·(log p + H), one fused pass) so it
  can serve as an entropy bonus.

  Args:
    logits: [..., V] float.
    temperature: τ > 0.
  Returns:
    [...] float32 entropies (nats).
  """
  v.check_floating(logits, "logits")
  v.check_range("temperature", temperature, low=0.0, low_inclusive=False)
  return _entropy(logits, temperature)
