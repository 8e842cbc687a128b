"""The PPO family (algorithms/ppo_family.py): `actor_loss`'s one dispatch to the PPO / GSPO /
GSPO-token / CISPO kernels, exact under micro-batching, and group estimators' per-sample
advantages broadcast over the response."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import kernels
from rlhf_jax import batch as batch_lib
from rlhf_jax.algorithms import losses
from rlhf_jax.algorithms import ppo_config
from rlhf_jax.algorithms import ppo_family
from tests.training.runs import preset

KERNELS = {"ppo": kernels.ppo_policy_loss, "gspo": kernels.gspo_policy_loss,
           "gspo_token": kernels.gspo_token_policy_loss, "cispo": kernels.cispo_policy_loss}
CLIPS = {"ppo": (0.2, 0.28), "gspo": (0.1, 0.15), "gspo_token": (0.1, 0.15),
         "cispo": (1.0, 0.28)}


def algorithm(kind, agg):
  a = ppo_config.algorithm_config()
  a.policy_loss.kind, a.policy_loss.agg = kind, agg
  a.policy_loss.clip_low, a.policy_loss.clip_high = CLIPS[kind]
  return a


def rollout_batch(rows=8, response_length=6, seed=0):
  """Ragged responses with per-response advantages, correction weights and a reference."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, response_length + 1, rows)
  batch = batch_lib.build_rollout_batch(
      [[1, 2]] * rows, [[3] * n for n in lengths],
      [list(-rng.uniform(0.1, 2.0, n)) for n in lengths], list(rng.choice([-1.0, 1.0], rows)),
      [False] * rows, [i // 4 for i in range(rows)], prompt_length=2,
      response_length=response_length, pad_id=0)
  batch = batch_lib.as_device(batch)
  mask = np.asarray(batch.response_mask)
  shape = mask.shape
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  batch = batch_lib.TrainBatch.from_rollout(
      batch, advantages=f32(rng.standard_normal((rows, 1)) * mask),
      is_weights=f32(rng.uniform(0.5, 1.5, shape) * mask),
      ref_logprobs=f32(-rng.uniform(0.1, 2.0, shape) * mask))
  logprobs = f32(batch.old_logprobs + rng.uniform(-0.4, 0.4, shape) * mask)
  entropy = f32(rng.uniform(0.0, 2.0, shape))
  return batch, logprobs, entropy


@pytest.mark.parametrize("kind", losses.BUILT_IN)
def test_actor_loss_dispatches_to_the_kind_s_kernel(kind):
  a = algorithm(kind, "seq-mean-token-mean")
  batch, logprobs, entropy = rollout_batch()
  loss, metrics = ppo_family.actor_loss(a, logprobs, entropy, batch,
                                        ppo_family.normalizers(a, batch))
  clip_low, clip_high = CLIPS[kind]
  expected, kernel_metrics = KERNELS[kind](
      logprobs, batch.old_logprobs, batch.advantages, batch.policy_mask(), clip_low=clip_low,
      clip_high=clip_high, agg="seq-mean-token-mean", weights=batch.is_weights)
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  np.testing.assert_allclose(metrics["pg_loss"], expected, rtol=1e-6)
  for key in ("clip_frac_upper", "clip_frac_lower", "approx_kl"):
    np.testing.assert_allclose(metrics[key], kernel_metrics[key], rtol=1e-6)
  # The kinds differ on this off-policy batch, so the dispatch is seen (GSPO-token has
  # GSPO's value with per-response advantages).
  for other in {"ppo", "gspo", "cispo"} - {kind, kind.replace("_token", "")}:
    other_loss, _ = KERNELS[other](
        logprobs, batch.old_logprobs, batch.advantages, batch.policy_mask(),
        clip_low=CLIPS[other][0], clip_high=CLIPS[other][1], agg="seq-mean-token-mean",
        weights=batch.is_weights)
    assert abs(float(other_loss) - float(loss)) > 1e-4, other


@pytest.mark.slow
@pytest.mark.parametrize("kind", losses.BUILT_IN)
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_micro_batches_sum_to_the_mini_batch(kind, agg):
  """With the KL loss, entropy bonus and positive NLL on: row slices that share the
  mini-batch's normalizers give the unsplit loss and gradient."""
  a = algorithm(kind, agg)
  a.kl.placement, a.kl.coef = "loss", 0.05
  a.policy_loss.entropy_coef, a.policy_loss.positive_nll_coef = 0.01, 0.1
  batch, logprobs, entropy = rollout_batch(seed=1)
  norm = ppo_family.normalizers(a, batch)

  def loss(lp, rows):
    piece = jax.tree.map(lambda x: x[rows], batch)
    return ppo_family.actor_loss(a, lp, entropy[rows], piece, norm)[0]

  whole = slice(0, 8)
  pieces = (slice(0, 2), slice(2, 5), slice(5, 8))
  total = sum(loss(logprobs[rows], rows) for rows in pieces)
  np.testing.assert_allclose(total, loss(logprobs, whole), rtol=1e-5, atol=1e-7)
  grads = np.concatenate([jax.grad(loss)(logprobs[rows], rows) for rows in pieces])
  np.testing.assert_allclose(grads, jax.grad(loss)(logprobs, whole), rtol=1e-5, atol=1e-8)


def test_group_estimators_broadcast_per_sample_advantages():
  algorithm = preset("grpo").algorithm
  batch = batch_lib.build_rollout_batch(
      [[1]] * 4, [[2, 3], [2], [2, 3, 4], [5]], [[0.0] * 2, [0.0], [0.0] * 3, [0.0]],
      [1.0, 0.0, 0.0, 0.0], [False] * 4, [0, 0, 1, 1], prompt_length=1, response_length=3,
      pad_id=0)
  advantages, _ = ppo_family.advantages_and_returns(
      algorithm, batch_lib.TrainBatch.from_rollout(batch_lib.as_device(batch)), 0.0,
      group_size=2)
  scores = np.array([1.0, 0.0, 0.0, 0.0]).reshape(2, 2)
  per_sample = ((scores - scores.mean(1, keepdims=True))
                / (scores.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
  np.testing.assert_allclose(advantages, per_sample[:, None] * batch.response_mask, atol=1e-5)
