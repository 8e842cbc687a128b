"""Q♯: decoding guided by the reference policy's return distribution (Zhou et al.,
"Q♯: Provably Optimal Distributional RL for LLM Post-Training", arXiv:2502.20548;
docs/formulas.md#qsharp).

For KL-regularised RL with deterministic transitions the optimal policy is

    π*(a|s) ∝ π_ref(a|s)·exp(Q*(s,a)/η),   Q*(s,a) = η·log E_{Z_ref(s,a)}[exp(R/η)]

where Z_ref(s,a) is the return distribution of rolling out π_ref after a. The guide
here is a categorical distribution over B return bins z_1..z_B for every next token:
a linear head on the frozen reference's final hidden states ([E] → [V, B]), so guiding
needs no second model or KV cache; the head is B times the LM head's size (E·V·B
parameters read at every decode step), which suits small vocabularies or few bins. Decoding keeps
π_ref's top-k next tokens and reweights them by exp(Q̂/η) (`guided_logits`, the
engine's logits hook). The head is fitted by cross-entropy to the two-hot bin of the
observed return (`guide_loss`) on an aggregated dataset: roll in with the guided
policy, roll out with π_ref, refit (algorithms/qsharp_fit.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def init_guide(hidden_size: int, vocab_size: int, num_bins: int) -> dict:
  """Guide params {"w": [E, V·B], "b": [V·B]} at zero: a uniform return distribution, so
  the first guided policy is π_ref restricted to its top-k."""
  return {"w": jnp.zeros((hidden_size, vocab_size * num_bins), jnp.float32),
          "b": jnp.zeros((vocab_size * num_bins,), jnp.float32)}


def bin_values(num_bins: int, low: float, high: float) -> np.ndarray:
  """The B return values z_b, evenly spaced from `low` to `high`."""
  if num_bins < 2 or not high > low:
    raise ValueError(f"num_bins={num_bins} must be >= 2 and high={high} > low={low}.")
  return np.linspace(low, high, num_bins, dtype=np.float32)


def bin_log_probs(guide: dict, hidden: jax.Array, num_bins: int) -> jax.Array:
  """[..., V, B] log P(R = z_b | s, a) for every next token a, from hidden [..., E]."""
  logits = jnp.matmul(hidden.astype(jnp.float32), guide["w"])
  logits = logits + guide["b"].reshape((1,) * (logits.ndim - 1) + (-1,))
  logits = logits.reshape(*hidden.shape[:-1], -1, num_bins)
  return jax.nn.log_softmax(logits, axis=-1)


def soft_q_over_eta(log_probs: jax.Array, values: jax.Array, eta: float) -> jax.Array:
  """[..., V] Q̂(s,a)/η = log Σ_b P(z_b|s,a)·exp(z_b/η) (the paper's Q* of Z_ref, over η)."""
  scaled = jnp.asarray(values, jnp.float32).reshape((1,) * (log_probs.ndim - 1) + (-1,)) / eta
  return jax.nn.logsumexp(log_probs + scaled, axis=-1)


def guided_logits(guide: dict, hidden: jax.Array, logits: jax.Array, *, values: np.ndarray,
                  eta: float, top_k: int) -> jax.Array:
  """[B, V] logits of π(a|s) ∝ π_ref(a|s)·exp(Q̂(s,a)/η) over π_ref's top-k tokens (−inf
  elsewhere): the engine's logits hook. `logits` are π_ref's, `hidden` [B, E] its
  final hidden states."""
  log_ref = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  kth = jax.lax.top_k(log_ref, top_k)[0][..., -1:]
  q = soft_q_over_eta(bin_log_probs(guide, hidden, len(values)), values, eta)
  return jnp.where(log_ref >= kth, log_ref + q, -jnp.inf)


def two_hot(returns: jax.Array, values: np.ndarray) -> jax.Array:
  """[N, B] targets: each return split between its two nearest bins so that the
  expected bin value is the return (clipped to [z_1, z_B])."""
  values = jnp.asarray(values)
  r = jnp.clip(returns, values[0], values[-1])
  upper = jnp.clip(jnp.searchsorted(values, r, side="left"), 1, len(values) - 1)
  lower = upper - 1
  weight = (r - values[lower]) / (values[upper] - values[lower])
  rows = jnp.arange(r.shape[0])
  out = jnp.zeros((r.shape[0], len(values)), jnp.float32)
  return out.at[rows, lower].add(1.0 - weight).at[rows, upper].add(weight)


def guide_loss(guide: dict, hidden: jax.Array, actions: jax.Array, returns: jax.Array,
               mask: jax.Array, *, values: np.ndarray) -> jax.Array:
  """Mean over masked positions of the cross-entropy between the guide's bin distribution
  for the taken token and the two-hot target of the row's return.

  Args:
    guide: the head's params.
    hidden: [N, T, E] the reference's hidden states before each action.
    actions: [N, T] the tokens taken.
    returns: [N] the observed returns (the rollout's outcome).
    mask: [N, T] 1 where the return after the action is a π_ref roll-out's.
    values: the bin values.
  """
  num_bins = len(values)
  # Only the taken token's B columns: [N, T, E, B] instead of [N, T, V, B] logits.
  w = guide["w"].reshape(guide["w"].shape[0], -1, num_bins)
  b = guide["b"].reshape(-1, num_bins)
  logits = jnp.einsum("nte,nteb->ntb", hidden.astype(jnp.float32),
                      jnp.moveaxis(w, 1, 0)[actions]) + b[actions]
  taken = jax.nn.log_softmax(logits, axis=-1)
  target = two_hot(returns, values)[:, None, :]
  cross_entropy = -jnp.sum(target * taken, axis=-1)
  return jnp.sum(cross_entropy * mask) / jnp.maximum(jnp.sum(mask), 1.0)
