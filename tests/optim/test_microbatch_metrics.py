"""Gradient accumulation logs the whole mini-batch's numbers: with U micro-batches the loss
terms normalised by the mini-batch's global count are summed over the micro-batches (each
holds its share), extremes take max, per-token means their mean (`combine_micro_metrics`).
Expected values: the same mini-batch with U = 1."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.optim.roles import TrainState
from rlhf_jax.optim.roles import minibatch_update

ROWS, RESPONSE = 8, 6


def minibatch():
  """8 rows, lengths such that every pair of rows (a micro-batch of U = 4) holds 8 tokens:
  per-token means then agree exactly; π_old, π_ref, advantages, values, returns random."""
  rng = np.random.default_rng(0)
  lengths = [3, 5, 6, 2, 4, 4, 2, 6]
  batch = batch_lib.build_rollout_batch(
      [[1, 2]] * ROWS, [list(rng.integers(3, 30, n)) for n in lengths],
      [list(-rng.uniform(0.1, 3.0, n)) for n in lengths],
      [1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0], [False] * ROWS, list(range(ROWS)),
      prompt_length=2, response_length=RESPONSE, pad_id=0)
  mask = np.asarray(batch.response_mask)
  noise = lambda scale: (rng.normal(size=mask.shape) * scale * mask).astype(np.float32)
  batch = batch_lib.TrainBatch.from_rollout(
      batch, ref_logprobs=batch.sampler_logprobs + noise(0.3), advantages=noise(1.0),
      values=noise(1.0), returns=noise(1.0))
  return batch_lib.as_device(batch), jnp.asarray(noise(0.5)), jnp.asarray(noise(0.5))


def algorithm():
  a = ppo_config.algorithm_config()
  a.kl.placement, a.kl.coef = "loss", 0.1
  a.policy_loss.entropy_coef = 0.01
  a.policy_loss.positive_nll_coef = 0.1
  a.value.clip = 0.2
  return a


def run(micro_batches, critic):
  """One optimizer step's (loss, metrics) on the mini-batch with `micro_batches` slices."""
  a = algorithm()
  batch, direction, value_direction = minibatch()

  def actor(params, piece, norm):
    # π_θ moves from π_old along a fixed per-token direction: ratios spread over the clip.
    logprobs = piece.old_logprobs + params * direction_of(piece, direction)
    return ppo_family.actor_loss(a, logprobs, -piece.old_logprobs, piece, norm)

  def value(params, piece, norm):
    return ppo_family.critic_loss(a, piece.values + params * direction_of(
        piece, value_direction), piece, norm)

  def direction_of(piece, full):
    # Which rows the piece holds: their group ids (0..7, one per row).
    return full[piece.group_ids]

  loss_fn, norm_fn = ((value, lambda b: ppo_family.critic_normalizers(a, b)) if critic else
                      (actor, lambda b: ppo_family.normalizers(a, b)))
  optimizer = optax.sgd(0.1)
  step = minibatch_update(loss_fn, norm_fn, lambda b: jnp.bool_(True), optimizer,
                          micro_batches)
  params = jnp.float32(1.0)
  state = TrainState(params=params, opt_state=optimizer.init(params))
  new_state, metrics = jax.jit(step)(state, (batch, None))
  return new_state, jax.device_get(metrics)


@pytest.mark.parametrize("critic", [False, True], ids=["actor", "critic"])
def test_logged_terms_are_the_minibatch_loss_under_micro_batching(critic):
  whole_state, whole = run(1, critic)
  split_state, split = run(4, critic)
  terms = ["value_loss"] if critic else ["pg_loss", "kl_loss", "positive_nll"]
  assert set(whole) == set(split)
  for name in terms + ["loss", "grad_norm"]:
    np.testing.assert_allclose(split[name], whole[name], rtol=2e-5, err_msg=name)
  np.testing.assert_allclose(split_state.params, whole_state.params, rtol=1e-6)
  # Terms of the loss add up to it (no hidden 1/U): pg + β·kl + μ·nll + c·entropy term.
  if not critic:
    a = algorithm()
    entropy_term = whole["loss"] - whole["pg_loss"] - a.kl.coef * whole["kl_loss"] - (
        a.policy_loss.positive_nll_coef * whole["positive_nll"])
    split_entropy_term = split["loss"] - split["pg_loss"] - a.kl.coef * split["kl_loss"] - (
        a.policy_loss.positive_nll_coef * split["positive_nll"])
    np.testing.assert_allclose(split_entropy_term, entropy_term, rtol=1e-4, atol=1e-6)
  # Per-token means over equal token counts, and extremes, agree too. Explained variance
  # is a ratio of variances: its micro-batches' mean is not the mini-batch's (roles.py).
  for name in sorted(set(whole) - set(terms) - {"loss", "grad_norm", "explained_variance"}):
    np.testing.assert_allclose(split[name], whole[name], rtol=2e-5, atol=1e-7, err_msg=name)
  if not critic:
    assert whole["clip_frac_upper"] + whole["clip_frac_lower"] > 0  # the clip is exercised
    assert whole["update_logprob_gap_max"] > whole["update_logprob_gap_mean"] > 0


def test_how_each_metric_combines_over_micro_batches():
  """Shares of a globally normalised term (the built-in names, and any `*_loss` a user's
  loss logs) add up; extremes take the extreme; per-token means are averaged."""
  from rlhf_jax.optim.roles import combine_micro_metrics
  stacked = {name: jnp.asarray([1.0, 2.0, 6.0]) for name in (
      "pg_loss", "positive_nll", "my_term_loss", "entropy", "update_logprob_gap_max",
      "ratio_min")}
  combined = {k: float(v) for k, v in combine_micro_metrics(stacked).items()}
  assert combined == {"pg_loss": 9.0, "positive_nll": 9.0, "my_term_loss": 9.0,
                      "entropy": 3.0, "update_logprob_gap_max": 6.0, "ratio_min": 1.0}
