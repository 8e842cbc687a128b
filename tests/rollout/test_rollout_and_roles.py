"""Rollout modes without a model, and the trained role's update in isolation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax import batch as batch_lib
from rlhf_jax.data import Example
from rlhf_jax.rollout import DynamicSamplingRollout
from rlhf_jax.rollout import Group
from rlhf_jax.rollout import NoSignalError
from rlhf_jax.algorithms import ppo_learner as learner_lib
from rlhf_jax import optim
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config
from tests.training.runs import preset

# Counts the programs jit lowers (each new compile lowers first) inside a `with` block.
from jax._src.test_util import count_jit_and_pmap_lowerings as count_lowerings  # noqa: E402


def group(correct):
  n = len(correct)
  return Group(Example("q", "1", "arith"), [1], [[2]] * n, [[0.0]] * n,
               [1.0 if c else -1.0 for c in correct], list(correct), [False] * n, [""] * n)


class ScriptedGenerator:
  """Each call returns the next scripted round of groups (no model, no sampler)."""

  def __init__(self, rounds):
    self.rounds = list(rounds)

  def generate_groups(self, examples):
    return self.rounds.pop(0)


class NullStream:
  def take(self, count):
    return [None] * count


def dynamic(rounds, max_rounds=10, **options):
  return DynamicSamplingRollout(ScriptedGenerator(rounds), NullStream(), prompts_per_step=2,
                                response_length=4, oversample=3, max_rounds=max_rounds,
                                **options)


def test_dynamic_sampling_with_keep_surplus_keeps_groups_for_the_next_step():
  mixed, solved, failed = [True, False], [True, True], [False, False]
  rollout = dynamic([[group(solved), group(mixed)], [group(mixed), group(mixed)],
                     [group(failed), group(failed)]], keep_surplus=True)
  kept, metrics = rollout.next_groups()
  assert len(kept) == 2 and len(rollout.buffer) == 1
  assert metrics["kept_groups_ratio"] == 3 / 4 and metrics["generation_rounds"] == 2
  # The next step starts from the buffered group and needs one more.
  rollout.generator.rounds = [[group(failed), group(mixed)]]
  kept, _ = rollout.next_groups()
  assert len(kept) == 2 and not rollout.buffer


def test_dynamic_sampling_gives_up_after_fruitless_rounds():
  rollout = dynamic([[group([True, True])] * 2] * 3, max_rounds=3)
  with pytest.raises(NoSignalError, match=r"rollout\.dynamic\.max_rounds=3"):
    rollout.next_groups()


def scored_group(scores, correct):
  n = len(scores)
  return Group(Example("q", "1", "f"), [1], [[2]] * n, [[0.0]] * n, list(scores),
               list(correct), [False] * n, [""] * n)


def test_dynamic_sampling_keeps_groups_whose_rewards_vary_by_default():
  # accuracy + format functions: 1.5 / 1.0 / 0.5, none "correct" (no verifier, not full
  # marks everywhere): the rewards vary, so the groups carry a signal (verl's std > 0)
  varied, equal = scored_group([1.5, 0.5], [False, False]), scored_group([1.0, 1.0], [True, False])
  rollout = dynamic([[varied, equal, varied]])
  kept, _ = rollout.next_groups()
  assert kept == [varied, varied]
  # the paper's rule on correctness keeps only the group whose verdicts vary
  rollout = dynamic([[varied, equal, equal]], signal="accuracy")
  kept, _ = rollout.next_groups()
  assert kept == [equal, equal]


def test_dynamic_sampling_that_finds_nothing_because_every_reward_failed_says_why():
  n = 2
  failed = Group(Example("q", "1", "f"), [1], [[2]] * n, [[0.0]] * n, [-1.0] * n,
                 [False] * n, [False] * n, ["reward.function f: raised KeyError: 'answer'"] * n)
  rollout = dynamic([[failed] * 6] * 2, max_rounds=2)
  with pytest.raises(NoSignalError, match="24 of 24 samples' rewards failed, the first: "
                                          "reward.function f: raised KeyError: 'answer'"):
    rollout.next_groups()


def test_dynamic_sampling_signal_is_checked():
  with pytest.raises(ConfigError, match=r"config\.rollout\.dynamic\.signal: invalid value "
                                        "'std': must be one of reward, accuracy"):
    c = base_config("arith")
    c.rollout.dynamic.signal = "std"
    validate_config(c)


def tiny_model():
  config = models.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, intermediate_size=24)
  return models.init_model(config, seed=0)


def random_batch(rows=8, prompt=3, response=5, seed=0):
  """A prepared batch with ragged responses, stale old log-probs and random advantages."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, response + 1, rows)
  batch = batch_lib.build_rollout_batch(
      [list(rng.integers(1, 32, prompt)) for _ in range(rows)],
      [list(rng.integers(1, 32, n)) for n in lengths],
      [list(-rng.uniform(2, 4, n)) for n in lengths], list(rng.choice([-1.0, 1.0], rows)),
      [False] * rows, list(range(rows)), prompt_length=prompt, response_length=response,
      pad_id=0)
  batch = batch.replace(advantages=rng.normal(size=(rows, response)).astype(np.float32),
                        is_weights=rng.uniform(0.5, 1.5, (rows, response)).astype(np.float32))
  return batch_lib.as_device(batch)


def actor(micro_batches, algorithm, minibatches=2, optimizer=None):
  model, params = tiny_model()
  train = preset("grpo").train
  train.minibatches, train.micro_batches = minibatches, micro_batches
  optimizer = optimizer or optim.make_optimizer(1e-2, weight_decay=0.0, max_grad_norm=1.0)
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  return learner_lib.actor_role(model, params, optimizer, mesh, algorithm, train)


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_give_the_unsplit_update(agg):
  algorithm = preset("vapo").algorithm  # clip-higher, positive-example NLL
  algorithm.policy_loss.agg = agg
  algorithm.policy_loss.entropy_coef = 0.01
  algorithm.kl.placement, algorithm.kl.coef = "loss", 0.1  # with zero reference log-probs
  batch, key = random_batch(), jax.random.key(3)
  # Plain SGD: parameters move by the gradient itself (Adam's g/√v would magnify float32
  # summation-order differences in near-zero gradients).
  whole = actor(1, algorithm, optimizer=optax.sgd(0.1))
  expected = whole.update(batch, key)
  for micro in (2, 4):
    split = actor(micro, algorithm, optimizer=optax.sgd(0.1))
    got = split.update(batch, key)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["grad_norm"], expected["grad_norm"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                 split.params, whole.params)


def test_a_non_finite_update_is_skipped():
  algorithm = preset("grpo").algorithm
  role = actor(1, algorithm, minibatches=1)
  before = jax.tree.map(np.asarray, role.params)
  batch = random_batch()
  metrics = role.update(batch.replace(advantages=jnp.full_like(batch.advantages, jnp.nan)),
                        jax.random.key(0))
  assert metrics["skipped"].tolist() == [1.0] and metrics["applied"].tolist() == [0.0]
  jax.tree.map(np.testing.assert_array_equal, role.params, before)
  with count_lowerings() as lowered:
    metrics = role.update(batch, jax.random.key(0))
  assert metrics["skipped"].tolist() == [0.0]
  assert lowered() == 0  # the second call compiled nothing
  assert not all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.all(np.asarray(a) == b)),
                                              role.params, before)))


def test_the_update_donates_the_state():
  role = actor(1, preset("grpo").algorithm, minibatches=1)
  old = role.params
  role.update(random_batch(), jax.random.key(0))
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old))


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
  out = learner.learn(batch.replace(old_logprobs=on_policy, sampler_logprobs=on_policy,
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
    learner.learn(batch.replace(old_logprobs=on_policy, sampler_logprobs=on_policy,
                                token_versions=jnp.full_like(batch.token_versions, step + 1)),
                  step=step + 1)
  assert lowered() == 0


def test_learning_rate_schedule_follows_warmup_then_cosine():
  def reference(k, lr=2.0, warmup=4, total=20, final=0.1):
    rate = lr * min(1.0, (k + 1) / warmup)
    progress = min(max((k + 1 - warmup) / (total - warmup), 0.0), 1.0)
    return rate * (final + (1 - final) * 0.5 * (1 + np.cos(np.pi * progress)))

  cosine = optim.rl_schedule(2.0, 4, decay_updates=20, final_fraction=0.1)
  constant = optim.rl_schedule(2.0, 4)
  for k in range(25):
    np.testing.assert_allclose(float(cosine(k)), reference(k), rtol=1e-6)
    np.testing.assert_allclose(float(constant(k)), 2.0 * min(1.0, (k + 1) / 4), rtol=1e-6)
  assert float(cosine(3)) == 2.0 and abs(float(cosine(19)) - 0.2) < 1e-6


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_packed_update_equals_the_padded_one(micro_batches):
  """One update (2 mini-batches) from packed buffers: the same loss, gradient norm and
  parameters as from the padded rows; micro-batches split rows by token count."""
  from rlhf_jax.algorithms.row_packer import RowPacker
  algorithm = preset("grpo").algorithm
  algorithm.policy_loss.entropy_coef = 0.01
  rng = np.random.default_rng(5)
  prompt_lengths = rng.integers(1, 5, 8)
  batch = random_batch(prompt=4, response=12, seed=5)
  # ragged prompts too: left-pad by blanking the first columns of the attention mask
  columns = np.arange(4)[None, :]
  prompt_mask = (columns >= 4 - prompt_lengths[:, None]).astype(np.int32)
  mask = np.asarray(batch.attention_mask).copy()
  mask[:, :4] = prompt_mask
  batch = batch.replace(attention_mask=jnp.asarray(mask),
                        tokens=jnp.where(jnp.asarray(mask) > 0, batch.tokens, 0))
  key = jax.random.key(7)
  padded = actor(micro_batches, algorithm, optimizer=optax.sgd(0.1))
  packed = actor(micro_batches, algorithm, optimizer=optax.sgd(0.1))
  expected = padded.update(batch, key)
  packing = RowPacker(minibatches=2, micro_batches=micro_batches).for_batch(batch)
  got = packed.update(batch, key, packing.update_plan)
  np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got["grad_norm"], expected["grad_norm"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               packed.params, padded.params)
  figures = packing.metrics()
  # 8 rows of 16 tokens (77 real) need ≥ 5 buffers of 16, so get the bucket of 8
  assert figures["packing/padding_fraction_prepare"] <= figures[
      "packing/padding_fraction_padded"]
  assert figures["packing/padding_fraction_update"] <= figures[
      "packing/padding_fraction_padded"]


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
