"""Preference losses: DPO (sigmoid, IPO, hinge) and pairwise reward-model losses."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.kernels import _validation as v

DPO_KINDS = ("sigmoid", "ipo", "hinge")


def _check_pairs(names_and_arrays):
  arrays = [a for _, a in names_and_arrays]
  shapes = {n: jnp.shape(a) for n, a in names_and_arrays}
  for name, array in names_and_arrays:
    if jnp.ndim(array) != 1:
      raise ValueError(f"{name} must be a [batch] vector; got shape {jnp.shape(array)}.")
    v.check_floating(array, name)
  if len(set(shapes.values())) > 1:
    raise ValueError(f"shape mismatch between per-pair arrays: {shapes}.")
  return v.as_float32(*arrays)


def dpo_loss(chosen_logps: chex.Array, rejected_logps: chex.Array,
             ref_chosen_logps: chex.Array, ref_rejected_logps: chex.Array, *,
             beta: float = 0.1, kind: str = "sigmoid", label_smoothing: float = 0.0,
             weights: chex.Array | None = None,
             normalizer: chex.Array | float | None = None
             ) -> tuple[chex.Array, dict[str, chex.Array]]:
  """Direct Preference Optimisation over (chosen, rejected) pairs: Σ_pairs w·ℓ / N.

  With z = (log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l)):

    sigmoid  −(1−s)·log σ(β·z) − s·log σ(−β·z)   (Rafailov et al. arXiv:2305.18290 Eq. 7;
                                                  s = label_smoothing, cDPO)
    ipo      (z − 1/(2β))²                        (Azar et al. arXiv:2310.12036 Eq. 17)
    hinge    max(0, 1 − β·z)                      (SLiC, Zhao et al. arXiv:2305.10425)

  Sequence log-probs are sums over response tokens (IPO's paper uses
  length-averaged ones: pass those for IPO if you want the paper's scale).
  TRL's `DPOTrainer` uses the same formulas and defaults (β 0.1).

  Metrics: implicit rewards β·(log π − log π_ref) of chosen and rejected
  (means), their margin, and reward accuracy (fraction with chosen > rejected).

  Args:
    chosen_logps: [B] policy sequence log-probs of the chosen responses.
    rejected_logps: [B] policy sequence log-probs of the rejected responses.
    ref_chosen_logps: [B] reference sequence log-probs of the chosen responses.
    ref_rejected_logps: [B] reference sequence log-probs of the rejected responses.
    beta: β > 0.
    kind: "sigmoid", "ipo" or "hinge".
    label_smoothing: s ∈ [0, 0.5), sigmoid only.
    weights: optional [B] 0/1 (or real) pair weights: the loss is Σ w·ℓ / N and the
      metrics are w-weighted means (pairs of groups without a preference weigh 0).
    normalizer: N, the global pair count under gradient accumulation; default Σ w
      (or B without weights).
  Returns:
    (loss, metrics).
  """
  v.check_choice("kind", kind, DPO_KINDS)
  v.check_range("beta", beta, low=0.0, low_inclusive=False)
  v.check_range("label_smoothing", label_smoothing, low=0.0, high=0.5, high_inclusive=False)
  if label_smoothing and kind != "sigmoid":
    raise ValueError(f"label_smoothing={label_smoothing} is only defined for kind='sigmoid'; "
                     f"got kind={kind!r}.")
  chosen, rejected, ref_chosen, ref_rejected = _check_pairs([
      ("chosen_logps", chosen_logps), ("rejected_logps", rejected_logps),
      ("ref_chosen_logps", ref_chosen_logps), ("ref_rejected_logps", ref_rejected_logps)])
  chosen_ratio = chosen - ref_chosen
  rejected_ratio = rejected - ref_rejected
  z = chosen_ratio - rejected_ratio
  if kind == "sigmoid":
    losses = (-(1.0 - label_smoothing) * jax.nn.log_sigmoid(beta * z)
              - label_smoothing * jax.nn.log_sigmoid(-beta * z))
  elif kind == "ipo":
    losses = jnp.square(z - 1.0 / (2.0 * beta))
  else:
    losses = jax.nn.relu(1.0 - beta * z)
  chosen_rewards = jax.lax.stop_gradient(beta * chosen_ratio)
  rejected_rewards = jax.lax.stop_gradient(beta * rejected_ratio)
  w = jnp.ones_like(losses) if weights is None else jnp.asarray(weights, jnp.float32)
  mean = lambda x: jnp.sum(w * x) / jnp.maximum(jnp.sum(w), 1e-8)
  metrics = {
      "reward_chosen": mean(chosen_rewards),
      "reward_rejected": mean(rejected_rewards),
      "reward_margin": mean(chosen_rewards - rejected_rewards),
      "reward_accuracy": mean((chosen_rewards > rejected_rewards).astype(jnp.float32)),
  }
  total = jnp.sum(w) if normalizer is None else jnp.asarray(normalizer, jnp.float32)
  return jnp.sum(w * losses) / jnp.maximum(total, 1e-8), metrics


def bradley_terry_loss(chosen_scores: chex.Array, rejected_scores: chex.Array, *,
                       margin: chex.Array | None = None) -> chex.Array:
  """Pairwise reward-model loss: −log σ(s_w − s_l − m), mean over pairs.

  The Bradley–Terry likelihood used to train scalar reward models
  (Ouyang et al., arXiv:2203.02155 Eq. 1); the optional margin m is Llama 2's
  (arXiv:2307.09288 §3.2.2, Eq. 2).

  Args:
    chosen_scores: [B] reward-model scores of the chosen responses.
    rejected_scores: [B] reward-model scores of the rejected responses.
    margin: optional [B] margins.
  Returns:
    Scalar float32 loss.
  """
  pairs = [("chosen_scores", chosen_scores), ("rejected_scores", rejected_scores)]
  if margin is not None:
    pairs.append(("margin", margin))
  arrays = _check_pairs(pairs)
  difference = arrays[0] - arrays[1]
  if margin is not None:
    difference = difference - arrays[2]
  return -jnp.mean(jax.nn.log_sigmoid(difference))


def position_debiased_preference(p_first_wins: chex.Array,
                                 p_first_wins_swapped: chex.Array) -> chex.Array:
  """P(y ≻ y′) from a pairwise judge asked in both orders.

      P = ½·[p(A | x, y, y′) + 1 − p(A | x, y′, y)]

  where p(A | x, a, b) is the judge's probability that the first response
  wins (Pairwise-RL, arXiv:2504.04950: the pairwise GenRM is trained with
  position swapping; averaging both orders removes position bias).

  Args:
    p_first_wins: [B] judge probability that y (shown first) wins.
    p_first_wins_swapped: [B] same judge with y′ shown first.
  Returns:
    [B] float32 probabilities that y beats y′.
  """
  first, swapped = _check_pairs([("p_first_wins", p_first_wins),
                                 ("p_first_wins_swapped", p_first_wins_swapped)])
  return 0.5 * (first + 1.0 - swapped)
