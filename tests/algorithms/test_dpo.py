"""DPO on a tiny model: the loss and its gradient against a direct computation from the
formula, pairing within groups, and the learner raising held-out reward accuracy."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.algorithms import dpo
from rlhf_jax.data import PreferencePair
from rlhf_jax.tasks import arith
from rlhf_jax.batch import response_logprobs
from rlhf_jax.optim.roles import FrozenRole

TOKENIZER = arith.tokenizer()
CONFIG = arith.model_config(vocab_size=TOKENIZER.vocab_size, hidden_size=32, num_layers=1,
                            num_heads=2, max_positions=64)
MODEL, PARAMS = models.init_model(CONFIG, seed=1)
P, R = 12, 12


def pairs(seed, count):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    a, b = rng.integers(1, 9, 2)
    out.append(PreferencePair(f"{a}+{b}?\n", f"Answer: {a + b}", "No"))
  return out


def direct_sequence_logp(params, prompt, response):
  """log π(response | prompt) by one unpadded forward and an explicit sum."""
  prompt_ids = TOKENIZER.encode(prompt)
  response_ids = TOKENIZER.encode(response) + [TOKENIZER.eos_id]
  ids = jnp.asarray([prompt_ids + response_ids], jnp.int32)
  logits, _ = MODEL.apply(params, ids)
  logp = jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)
  return sum(logp[len(prompt_ids) - 1 + t, token] for t, token in enumerate(response_ids))


def pair_batch(data, reference_params):
  """Groups of (chosen, rejected) rows with the reference's log-probs, paired on device."""
  batch = dpo.encode_preference_pairs(TOKENIZER, data, prefix=(), prompt_length=P,
                                      response_length=R)
  ref = response_logprobs(MODEL, reference_params, batch)
  return dpo.pairs_from_groups(batch.replace(ref_logprobs=ref), 2)


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


@pytest.mark.slow
def test_dpo_learner_learns_the_preference_from_the_starting_policy_reference():
  from rlhf_jax.parallel import make_mesh
  from rlhf_jax.algorithms.dpo_learner import DPOLearner, dpo_actor_role
  from rlhf_jax.optim import make_optimizer
  mesh = make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  d = ml_collections.ConfigDict(dict(beta=0.1, kind="sigmoid", label_smoothing=0.0,
                                     reference="online", reference_sync_every=0))
  train = ml_collections.ConfigDict(dict(epochs=1, minibatches=1, micro_batches=1))
  actor = dpo_actor_role(MODEL, jax.tree.map(jnp.copy, PARAMS), make_optimizer(3e-3, max_grad_norm=1.0),
                         mesh, d, train)
  learner = DPOLearner(d, actor, FrozenRole(MODEL, PARAMS), group_size=2, seed=0)
  held_out = pair_batch(pairs(2, 16), PARAMS)
  objective = jax.jit(lambda params: dpo.dpo_loss_fn(MODEL, d)(params, held_out, 16.0))
  before, _ = objective(actor.params)
  assert float(before) == pytest.approx(np.log(2), abs=1e-5)  # π = π_ref: z = 0
  data = pairs(1, 48)
  for step in range(25):
    chunk = data[(step * 8) % 48:(step * 8) % 48 + 8]
    out = learner.learn(dpo.encode_preference_pairs(TOKENIZER, chunk, prefix=(),
                                                    prompt_length=P, response_length=R), step)
  assert float(out["prepare"]["dpo/pairs_with_preference"]) == 1.0
  after, metrics = objective(actor.params)
  assert float(metrics["reward_accuracy"]) >= 0.9
  assert float(after) < float(before)
