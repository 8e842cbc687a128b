"""DPO on a tiny model: the loss and its gradient against a direct computation from the
formula, the reference cache, and training raising held-out reward accuracy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.algorithms import dpo
from rlhf_jax.data import PreferencePair
from rlhf_jax.tasks import arith
from rlhf_jax.training import dpo_training

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


@pytest.mark.parametrize("kind, smoothing", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0),
                                             ("hinge", 0.0)])
def test_dpo_loss_and_gradient_match_a_direct_computation(kind, smoothing):
  data = pairs(0, 4)
  batch = dpo_training.pair_data(MODEL, PARAMS, TOKENIZER, data, prefix=(), prompt_length=P,
                                 response_length=R)
  reference = jax.tree.map(lambda x: x * 0.9, PARAMS)  # a policy that moved
  beta = 0.5
  objective = dpo.dpo_objective(MODEL, beta=beta, kind=kind, label_smoothing=smoothing)

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

  (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(reference, batch)
  expected, expected_grads = jax.value_and_grad(direct)(reference)
  assert float(loss) == pytest.approx(float(expected), rel=1e-4, abs=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-5)
  chosen = [float(direct_sequence_logp(reference, p.prompt, p.chosen)) for p in data]
  assert float(metrics["chosen_logps"]) == pytest.approx(np.mean(chosen), rel=1e-4)


def test_the_reference_cache_is_the_starting_policy_and_dpo_learns_the_preference():
  train = dpo_training.pair_data(MODEL, PARAMS, TOKENIZER, pairs(1, 48), prefix=(),
                                 prompt_length=P, response_length=R)
  held_out = dpo_training.pair_data(MODEL, PARAMS, TOKENIZER, pairs(2, 16), prefix=(),
                                    prompt_length=P, response_length=R)
  first = pairs(1, 1)[0]
  assert train.ref_chosen[0] == pytest.approx(
      float(direct_sequence_logp(PARAMS, first.prompt, first.chosen)), abs=1e-4)
  result = dpo_training.train_dpo(MODEL, PARAMS, train, held_out, steps=25, batch_size=8,
                                  learning_rate=3e-3, beta=0.1)
  assert result.before["loss"] == pytest.approx(np.log(2), abs=1e-5)  # π = π_ref: z = 0
  assert result.after["reward_accuracy"] >= 0.9
  assert result.after["loss"] < result.before["loss"]
