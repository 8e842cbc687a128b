"""DPO's loss on a tiny model (algorithms/dpo.py): the loss and its gradient against a direct
computation from the formula, and the pairing within groups."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlhf_jax.algorithms import dpo
from tests.algorithms.dpo_pairs import MODEL
from tests.algorithms.dpo_pairs import P
from tests.algorithms.dpo_pairs import PARAMS
from tests.algorithms.dpo_pairs import R
from tests.algorithms.dpo_pairs import TOKENIZER
from tests.algorithms.dpo_pairs import pair_batch
from tests.algorithms.dpo_pairs import pairs


def direct_sequence_logp(params, prompt, response):
  """log π(response | prompt) by one unpadded forward and an explicit sum."""
  prompt_ids = TOKENIZER.encode(prompt)
  response_ids = TOKENIZER.encode(response) + [TOKENIZER.eos_id]
  ids = jnp.asarray([prompt_ids + response_ids], jnp.int32)
  logits, _ = MODEL.apply(params, ids)
  logp = jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)
  return sum(logp[len(prompt_ids) - 1 + t, token] for t, token in enumerate(response_ids))


@pytest.mark.slow
@pytest.mark.parametrize("kind, smoothing", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0),
                                             ("hinge", 0.0)])
def test_dpo_loss_and_gradient_match_a_direct_computation(kind, smoothing):
  data = pairs(0, 4)
  batch = pair_batch(data, PARAMS)
  reference = jax.tree.map(lambda x: x * 0.9, PARAMS)  # a policy that moved
  beta = 0.5
  d = ml_collections.ConfigDict(dict(beta=beta, kind=kind, label_smoothing=smoothing))
  objective = dpo.dpo_loss_fn(MODEL, d)

  def direct(params):
    losses = []
    for pair in data:
      z = ((direct_sequence_logp(params, pair.prompt, pair.chosen)
            - direct_sequence_logp(PARAMS, pair.prompt, pair.chosen))
           - (direct_sequence_logp(params, pair.prompt, pair.rejected)
              - direct_sequence_logp(PARAMS, pair.prompt, pair.rejected)))
      if kind == "sigmoid":
        losses.append(-(1 - smoothing) * jax.nn.log_sigmoid(beta * z)
                      - smoothing * jax.nn.log_sigmoid(-beta * z))
      elif kind == "ipo":
        losses.append((z - 1 / (2 * beta)) ** 2)
      else:
        losses.append(jnp.maximum(0.0, 1 - beta * z))
    return sum(losses) / len(losses)

  (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(
      reference, batch, jnp.sum(batch.weights))
  expected, expected_grads = jax.value_and_grad(direct)(reference)
  assert float(loss) == pytest.approx(float(expected), rel=1e-4, abs=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-5)
  chosen = [float(direct_sequence_logp(reference, p.prompt, p.chosen)) for p in data]
  assert float(metrics["chosen_logps"]) == pytest.approx(np.mean(chosen), rel=1e-4)


def test_pairs_from_groups_take_the_best_and_the_worst_and_weigh_ties_zero():
  scores = np.array([0.2, 0.9, -0.5, 0.9,   1.0, 1.0, 1.0, 1.0,   0.0, -1.0, 3.0, 2.0],
                    np.float32)
  batch = dpo.encode_preference_pairs(TOKENIZER, pairs(3, 6), prefix=(), prompt_length=P,
                                      response_length=R)
  batch = batch.replace(scores=scores, tokens=np.arange(12)[:, None] + 0 * batch.tokens)
  out = dpo.pairs_from_groups(batch, 4)
  np.testing.assert_array_equal(np.asarray(out.chosen.tokens)[:, 0], [1, 4, 10])
  np.testing.assert_array_equal(np.asarray(out.rejected.tokens)[:, 0], [2, 4, 9])
  np.testing.assert_array_equal(out.weights, [1.0, 0.0, 1.0])
