"""Per-token KL estimators between the policy and a reference (Schulman's k1/k2/k3).

With Δ = log π(a|s) − log π_ref(a|s) for a ~ π (J. Schulman, "Approximating KL
Divergence", 2020):

  k1  = Δ                          unbiased, high variance, can be negative
  k2  = ½·Δ²                       biased, low variance; ∇k2 is the unbiased
                                   gradient of KL(π‖π_ref) under on-policy samples
  k3  = exp(−Δ) − 1 + Δ            unbiased, ≥ 0, low variance ("low_var_kl")
  abs = |Δ|
  X+       straight-through for every X above (k1+, k2+, k3+, abs+): the forward
           value of X with the gradient of k2 (k2+ is k2)

Clamps (verl `kl_penalty`): k3 clamps Δ to [−20, 20] before the exp and the
result to [−10, 10]; the others are unclamped. verl's names map as
kl→k1, mse→k2, low_var_kl→k3, and verl accepts a "+" after any of them.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v

KL_ESTIMATORS = ("k1", "k2", "k3", "abs", "k1+", "k2+", "k3+", "abs+")
_VERL_NAMES = "verl's names: kl=k1, mse=k2, low_var_kl=k3, with '+' for straight-through."
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def _estimate(delta: chex.Array, estimator: str) -> chex.Array:
  if estimator == "k1":
    return delta
  if estimator == "k2":
    return 0.5 * jnp.square(delta)
  if estimator == "abs":
    return jnp.abs(delta)
  # k3: exp(−Δ) − 1 + Δ, written as ratio − log ratio − 1 with log ratio = −Δ.
  neg_delta = jnp.clip(-delta, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
  return jnp.clip(jnp.exp(neg_delta) - neg_delta - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)


def kl_penalty(logprobs: chex.Array, ref_logprobs: chex.Array, *,
               estimator: str) -> chex.Array:
  """Per-token KL estimate between the sampling policy and the reference.

  See the module docstring for the formulas. Straight-through variants return
  k2 + stop_gradient(k − k2): the value of k, the gradient of k2.

  Args:
    logprobs: [B, T] (any shape) log π(a_t|s_t) of the sampled tokens.
    ref_logprobs: same shape, log π_ref(a_t|s_t).
    estimator: one of "k1", "k2", "k3", "abs", "k1+", "k2+", "k3+", "abs+".
  Returns:
    float32 array of the input shape (unmasked; aggregate with a mask).
  """
  v.check_choice("estimator", estimator, KL_ESTIMATORS, hint=_VERL_NAMES)
  chex.assert_equal_shape([logprobs, ref_logprobs])
  v.check_floating(logprobs, "logprobs")
  v.check_floating(ref_logprobs, "ref_logprobs")
  delta = jnp.asarray(logprobs, jnp.float32) - jnp.asarray(ref_logprobs, jnp.float32)
  if estimator.endswith("+"):
    forward = _estimate(delta, estimator[:-1])
    backward = _estimate(delta, "k2")
    return backward + jax.lax.stop_gradient(forward - backward)
  return _estimate(delta, estimator)


def adaptive_kl_coefficient(coefficient: chex.Array, observed_kl: chex.Array, *,
                            target: float, horizon: float,
                            n_steps: int | chex.Array) -> chex.Array:
  """One update of the adaptive KL controller (Ziegler et al., arXiv:1909.08593 §2.2).

      e = clip(KL / target − 1, −0.2, 0.2),   β ← β·(1 + e·n_steps / horizon)

  (verl `AdaptiveKLController`, OpenAI lm-human-preferences.)

  Args:
    coefficient: current β (scalar).
    observed_kl: mean KL of the last batch (scalar).
    target: target KL > 0.
    horizon: horizon > 0 in samples.
    n_steps: samples in the last batch.
  Returns:
    The new β (float32 scalar).
  """
  v.check_range("target", target, low=0.0, low_inclusive=False)
  v.check_range("horizon", horizon, low=0.0, low_inclusive=False)
  error = jnp.clip(jnp.asarray(observed_kl, jnp.float32) / target - 1.0, -0.2, 0.2)
  return jnp.asarray(coefficient, jnp.float32) * (1.0 + error * n_steps / horizon)
