"""The PPO learner (algorithms/ppo_learner.py): one update raises the rewarded responses and
lowers the others, fresh rows reuse the sampler's log-probs, and LoRA adapters with an EMA
reference (`model.lora_rank > 0`, `algorithm.kl.reference_ema > 0`) move the reference toward
the merged policy weights, in the plain model's layout."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.algorithms.ppo_learner import PPOLearner
from rlhf_jax.algorithms import ppo_learner as learner_lib
from rlhf_jax.models import lora as lora_lib
from tests.algorithms.actors import actor
from tests.algorithms.actors import random_batch
from tests.algorithms.actors import tiny_model
from tests.training.runs import preset

# Counts the programs jit lowers (each new compile lowers first) inside a `with` block.
from jax._src.test_util import count_jit_and_pmap_lowerings as count_lowerings  # noqa: E402


def lora_ema_config(rate):
  """GRPO with a KL loss, LoRA adapters of rank 2 and an EMA reference of rate `rate`."""
  c = preset("grpo")
  c.model.lora_rank, c.model.lora_alpha = 2, 4.0
  c.algorithm.kl.reference_ema = rate
  c.optimizer.learning_rate, c.optimizer.warmup_steps = 5e-2, 1
  c.train.minibatches = 1
  return c


def sampled_batch(model, params, rows=8, prompt=3, response=5, seed=0):
  """Random prompts and responses whose sampler log-probs are the model's own."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, response + 1, rows)
  batch = batch_lib.build_rollout_batch(
      [list(rng.integers(1, 32, prompt)) for _ in range(rows)],
      [list(rng.integers(1, 32, n)) for n in lengths], [[0.0] * n for n in lengths],
      list(rng.choice([-1.0, 1.0], rows)), [False] * rows, [0] * rows,
      prompt_length=prompt, response_length=response, pad_id=0)
  batch = batch_lib.as_device(batch)
  own = batch_lib.response_logprobs(model, params, batch)
  return batch.replace(sampler_logprobs=own)


@pytest.mark.slow
def test_an_ema_reference_follows_the_merged_lora_policy():
  """Two updates of a LoRA policy with reference_ema η: after each, the reference equals
  (1 − η)·reference + η·merged(adapters, base), computed here directly (it raised a
  pytree-structure error after the first update: the {adapters, base} tree fed the EMA)."""
  rate = 0.25
  c = lora_ema_config(rate)
  config = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, intermediate_size=24)
  model, params = models.init_model(config, seed=0)
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  learner = PPOLearner.from_config(c, model, params, mesh)
  assert set(learner.actor.params) == {"adapters", "base"}
  lora = learner.actor.model.lora
  for step in range(2):
    reference = jax.tree.map(np.asarray, learner.reference.params)
    batch = sampled_batch(model, learner.policy_params, seed=step)
    batch = batch.replace(token_versions=jnp.full_like(batch.token_versions, step))
    learner.learn(batch, step=step)
    adapters = jax.tree.map(np.asarray, learner.actor.params["adapters"])
    base = jax.tree.map(np.asarray, learner.actor.params["base"])
    merged = lora_lib.merge(base, adapters, lora)
    expected = jax.tree.map(lambda r, m: (1 - rate) * r + rate * np.asarray(m),
                            reference, merged)
    assert jax.tree.structure(learner.reference.params) == jax.tree.structure(expected)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6,
                                                              atol=1e-7),
                 learner.reference.params, expected)
    # The adapters moved, so the reference is no longer the base alone.
    assert not all(np.array_equal(np.asarray(a), b) for a, b in zip(
        jax.tree.leaves(learner.reference.params), jax.tree.leaves(reference)))


# The critic presets compile a critic update too (~10 s of CPU each): slow.
@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo", "cispo"] + [
    pytest.param(name, marks=pytest.mark.slow) for name in ("ppo", "vcppo", "vapo")])
def test_an_update_raises_rewarded_responses_and_lowers_the_others(name):
  """The advantage's sign reaches the tokens: after one on-policy update from a group of
  8 responses (3 rewarded), the rewarded ones are more likely and the others less.

  The critic presets (PPO: GAE λ 0.95 and whitening; VC-PPO: decoupled λ; VAPO:
  length-adaptive λ and positive NLL) learn with their critic as `PPOLearner.from_config`
  builds it: the policy's backbone with a zero value head, updated in the same `learn`
  before the actor, at the first step after value pretraining."""
  algorithm = preset(name).algorithm
  algorithm.kl.placement = "none"
  algorithm.overlong.penalty = False  # its buffer is longer than these 5-token responses
  model, params = tiny_model()
  train = preset(name).train
  train.minibatches, train.micro_batches = 1, 1
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  critic = None
  if algorithm.advantage.estimator == "gae":
    critic_model, critic_params = models.critic_from_policy(model, params)
    # A copy: the actor's update donates the backbone arrays the two share.
    critic_params = jax.tree.map(lambda x: x.copy(), critic_params)
    critic = learner_lib.critic_role(critic_model, critic_params, optax.sgd(0.05), mesh,
                                     algorithm, train)
  role = learner_lib.actor_role(model, params, optax.sgd(0.05), mesh, algorithm, train)
  learner = learner_lib.PPOLearner(algorithm, role, critic, None, correction="none",
                                   group_size=8, seed=0)
  rng = np.random.default_rng(0)
  lengths = rng.integers(3, 6, 8)
  rewarded = np.array([True, False, False, True, False, True, False, False])
  batch = batch_lib.build_rollout_batch(
      [[5, 6, 7]] * 8, [list(rng.integers(1, 32, n)) for n in lengths],
      [[0.0] * n for n in lengths], list(np.where(rewarded, 1.0, -1.0)), [False] * 8,
      [0] * 8, prompt_length=3, response_length=5, pad_id=0)
  batch = batch_lib.as_device(batch)

  def mean_logprob(p):
    logprobs = batch_lib.response_logprobs(model, p, batch)
    return np.asarray((logprobs * batch.response_mask).sum(1) / batch.response_mask.sum(1))

  before = mean_logprob(role.params)
  value_head = None if critic is None else np.asarray(critic.params["scalar_head"])
  on_policy = batch_lib.response_logprobs(model, role.params, batch)
  # VC-PPO / VAPO leave the actor alone for `value.pretrain_steps` steps: learn at the
  # first step after, from tokens the current policy (version = step) sampled.
  step = algorithm.value.pretrain_steps
  out = learner.learn(batch.replace(sampler_logprobs=on_policy,
                                    token_versions=jnp.full_like(batch.token_versions, step)),
                      step=step)
  assert "actor" in out
  change = mean_logprob(role.params) - before
  assert np.all(change[rewarded] > 0), change
  assert np.all(change[~rewarded] < 0), change
  if critic is not None:  # the critic was present and learned from the same batch
    assert np.all(np.isfinite(np.asarray(out["critic"]["value_loss"])))
    assert not np.array_equal(np.asarray(critic.params["scalar_head"]), value_head)
  # The next step runs the programs the first compiled: the updated state keeps its
  # layout (a step count on another layout once compiled every update twice).
  with count_lowerings() as lowered:
    learner.learn(batch.replace(sampler_logprobs=on_policy,
                                token_versions=jnp.full_like(batch.token_versions, step + 1)),
                  step=step + 1)
  assert lowered() == 0


def test_fresh_rows_reuse_the_sampler_logprobs_and_stale_ones_do_not():
  """One optimizer step per batch, no correction: an all-fresh batch takes π_old from
  the sampler without the trainer's forward; one stale token brings the forward back."""
  algorithm = preset("grpo").algorithm
  role = actor(1, algorithm, minibatches=1, optimizer=optax.sgd(0.0))
  learner = learner_lib.PPOLearner(algorithm, role, None, None, correction="none",
                                   group_size=8, seed=0, reuse_sampler_logprobs=True)
  batch = random_batch(seed=3)  # sampler log-probs: random numbers, not the model's
  trainer = np.asarray(batch_lib.response_logprobs(role.model, role.params, batch))
  fresh = batch.replace(token_versions=jnp.zeros_like(batch.token_versions))
  prepared, _, metrics = learner._prepare(role.params, None, None, learner.kl_coef,
                                          jnp.int32(0), fresh, None)
  assert float(metrics["reused_sampler_logprobs"]) == 1.0
  np.testing.assert_array_equal(prepared.old_logprobs,
                                np.asarray(batch.sampler_logprobs * batch.response_mask))
  stale = fresh.replace(token_versions=fresh.token_versions.at[0, 0].set(-1))
  prepared, _, metrics = learner._prepare(role.params, None, None, learner.kl_coef,
                                          jnp.int32(0), stale, None)
  assert float(metrics["reused_sampler_logprobs"]) == 0.0
  # π_prox of the stale token is the trainer's; fresh ones keep the sampler's (no
  # correction: `behaviour_correction`), and the mismatch is measured against the forward.
  np.testing.assert_allclose(prepared.old_logprobs[0, 0], trainer[0, 0], atol=1e-6)
  np.testing.assert_array_equal(prepared.old_logprobs[1:],
                                np.asarray(batch.sampler_logprobs * batch.response_mask)[1:])
  assert float(metrics["logprob_mismatch_max"]) > 0.01  # random sampler numbers
